"""Service ports that cannot race (``infra.process``): picked outside the kernel's ephemeral range, checked free
when picked, and a service whose port was taken all the same is restarted on fresh ports, with one ``warning:``
line per retry; when every start fails, one error naming the service, the port, what holds it and the log.

The services' tests hand the service a port this test holds (a listening socket), the way a connection or another
program could take it between the pick and the service's bind: the service must come up on another port."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

import infra.process as proc
from infra.process import (PortClash, PortInUseError, ServiceError, ephemeral_port_range, find_port_clash,
                           pick_ports, port_holder, service_port_ranges, start_on_fresh_ports)


def _listener() -> socket.socket:
    """A socket of this test listening on 127.0.0.1 (a port the kernel chose): a port some program holds."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s


def _unused_port() -> int:
    """A port free now, found without :func:`pick_ports` (which would remember it as handed out)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the picker ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("40000\t50000\n", (40000, 50000)),
    ("1024 65535", (1024, 65535)),
    ("", proc.FALLBACK_EPHEMERAL_RANGE),
    ("32768", proc.FALLBACK_EPHEMERAL_RANGE),
    ("60999 32768", proc.FALLBACK_EPHEMERAL_RANGE),  # not low <= high
    ("0 70000", proc.FALLBACK_EPHEMERAL_RANGE),
    ("a b", proc.FALLBACK_EPHEMERAL_RANGE),
])
def test_the_ephemeral_range_is_read_from_the_kernels_file(tmp_path, text, expected):
    f = tmp_path / "ip_local_port_range"
    f.write_text(text)
    assert ephemeral_port_range(f) == expected


def test_without_the_kernels_file_the_range_falls_back_to_cover_linux_and_the_bsds(tmp_path):
    assert ephemeral_port_range(tmp_path / "missing") == (32768, 65535)
    assert service_port_ranges((32768, 65535)) == [range(20000, 32768)]


@pytest.mark.parametrize("ephemeral, expected", [
    ((32768, 60999), [range(20000, 32768), range(61000, 65536)]),  # Linux's default
    ((49152, 65535), [range(20000, 49152)]),  # IANA's (macOS)
    ((20000, 65535), [range(1024, 20000)]),  # nothing above 20000 left: below it
    ((1024, 65535), [range(20000, 65536)]),  # everything ephemeral: what is left to the retries
])
def test_service_ports_lie_outside_the_ephemeral_range(ephemeral, expected):
    assert service_port_ranges(ephemeral) == expected


def test_picked_ports_are_outside_the_range_the_kernel_file_gives(tmp_path, monkeypatch):
    f = tmp_path / "ip_local_port_range"
    f.write_text("21000\t64999\n")  # leaves 20000-20999 and 65000-65535
    monkeypatch.setattr(proc, "EPHEMERAL_RANGE_FILE", f)
    ports = pick_ports(40)
    assert len(set(ports)) == 40
    assert all(20000 <= p < 21000 or 65000 <= p <= 65535 for p in ports), ports
    assert all(proc.port_is_free(p) for p in ports)


def test_a_held_port_is_never_picked_and_a_picked_one_is_not_handed_out_twice():
    held = _listener()
    try:
        h, free = held.getsockname()[1], _unused_port()
        pool = [range(h, h + 1), range(free, free + 1)]
        assert proc.port_is_free(h) is False and proc.port_is_free(free) is True
        assert pick_ports(1, ranges=pool) == [free]
        with pytest.raises(ServiceError, match=r"found only 0 of 1 free TCP port"):
            pick_ports(1, ranges=pool)  # the held one is not free, the other was just handed out
    finally:
        held.close()


@pytest.mark.parametrize("line, ours, port", [
    ("E1206 06:23:44.351607 mini.go:1244 Port allocation failed: port 36881 for S3 (specified by flag s3.port) is "
     "not available on 127.0.0.1 and cannot be used", [36881, 20001], 36881),
    ("F1206 06:23:44.351607 s3.go:12] S3 API Server listener on 127.0.0.1:60171 error: listen tcp "
     "127.0.0.1:60171: bind: address already in use", [60171], 60171),
    ("I1206 06:23:44 filer.go:9] listen tcp 127.0.0.1:20002: bind: address already in use", [60171, 20002], 20002),
    ("ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 4200): address already in use",
     [4200], 4200),
    ("Port 4200 is already in use. Please specify a different port with the --port flag.", [4200], 4200),
    ("OSError: [Errno 98] Address already in use", [8000], 8000),  # vLLM's: no port named, its main port
    ("ValueError: Failed to bind to 127.0.0.1:52365 because it's already occupied.", [6379, 52365], 52365),
])
def test_a_port_clash_is_found_in_each_services_own_words(line, ours, port):
    text = f"starting\n{line}\nexiting\n"
    assert find_port_clash(text, ours) == PortClash(port, line)


def test_a_clash_on_a_port_that_is_not_the_services_is_not_its_own():
    """torch's rendezvous logs a failed bind of its own port, then binds another address: not a port of ours."""
    text = ("[W socket.cpp:464] The server socket has failed to bind to [::]:29500 (errno: 98 - Address already "
            "in use).\nINFO Started server process\n")
    assert find_port_clash(text, [8000]) is None
    assert find_port_clash(text) == PortClash(29500, text.splitlines()[0])
    assert find_port_clash("all good\n", [8000]) is None


def test_the_holder_of_a_port_is_named():
    held = _listener()
    try:
        h = held.getsockname()[1]
        assert port_holder(h).startswith(f"pid {os.getpid()} (") and f"listening on 127.0.0.1:{h}" in port_holder(h)
    finally:
        held.close()
    assert port_holder(h) == "nothing holds it any more (a short-lived socket took it)"


# --- the start-up wrapper, on a service that starts in a second ------------------------------------------------

class _HttpServer(proc.ServiceMixin):
    """``python -m http.server`` on a picked port: a service that starts at once and fails to bind, without
    naming the port, with ``OSError: [Errno 98] Address already in use``."""

    def __init__(self, log_dir: Path, picks):
        self.log_dir, self.picks, self.port, self.process = log_dir, picks, 0, None

    def start(self):
        def repick():
            self.port = 0

        return start_on_fresh_ports("test server", self._once, process=lambda: self.process, repick=repick)

    def _once(self):
        self.port = self.port or self.picks()
        self.process = proc.ManagedProcess(
            "http", [sys.executable, "-m", "http.server", str(self.port), "--bind", "127.0.0.1"],
            self.log_dir / f"http-{self.port}.log", health_url=f"http://127.0.0.1:{self.port}/",
            start_timeout_s=30, ports=(self.port,))
        self.process.start()
        return self


def test_a_service_whose_port_is_taken_starts_again_on_another_port(tmp_path, capfd):
    held = _listener()
    h = held.getsockname()[1]
    picks = iter([h, pick_ports(1)[0]])
    try:
        with _HttpServer(tmp_path, lambda: next(picks)) as srv:
            assert srv.port != h and srv.alive()
            assert proc.port_is_free(srv.port) is False  # it serves there
    finally:
        held.close()
    err = capfd.readouterr().err
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1, err
    assert warnings[0].startswith(f"warning: test server: port {h} on 127.0.0.1 was taken before it could bind it "
                                  f"(now: pid {os.getpid()} (")
    assert f"restarting it on fresh ports (start 2 of 3; log {tmp_path / f'http-{h}.log'})" in warnings[0]


def test_when_every_start_finds_its_port_taken_the_error_names_port_holder_and_log(tmp_path, capfd):
    held = [_listener() for _ in range(3)]
    ports = [s.getsockname()[1] for s in held]
    picks = iter(ports)
    try:
        with pytest.raises(PortInUseError) as e:
            _HttpServer(tmp_path, lambda: next(picks)).start()
    finally:
        for s in held:
            s.close()
    msg = str(e.value)
    assert msg.startswith(f"test server could not bind port {ports[2]} on 127.0.0.1: it is in use on each of its 3 "
                          f"starts (ports {ports[0]}, {ports[1]}, {ports[2]} in turn); now: pid {os.getpid()} (")
    assert f"listening on 127.0.0.1:{ports[2]}; its log says: OSError: [Errno 98] Address already in use" in msg
    assert msg.endswith(f"; log {tmp_path / f'http-{ports[2]}.log'}") and "\n" not in msg
    assert "connect" not in msg.lower()
    assert (e.value.service, e.value.port) == ("test server", ports[2])
    warnings = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("warning:")]
    assert [w.split(" on 127.0.0.1")[0] for w in warnings] == [f"warning: test server: port {p}" for p in ports[:2]]


def test_a_failure_that_is_not_a_port_is_not_retried(tmp_path, capfd):
    calls = []

    def once():
        calls.append(1)
        raise ServiceError("model not found")

    with pytest.raises(ServiceError, match="^model not found$"):
        start_on_fresh_ports("x", once, process=lambda: None, repick=lambda: None)
    assert calls == [1] and "warning:" not in capfd.readouterr().err


# --- the embedded services, each handed a port this test holds --------------------------------------------------

def _first_pick_held(monkeypatch, module, held_port: int) -> list[int]:
    """Make ``module.pick_ports`` return ``held_port`` as the first port of its first call (the service's main
    port); returns the list of the calls' ``n``."""
    calls: list[int] = []

    def picks(n: int = 1, **kw):
        calls.append(n)
        got = pick_ports(n, **kw)
        return [held_port, *got[1:]] if len(calls) == 1 else got

    monkeypatch.setattr(module, "pick_ports", picks)
    return calls


@pytest.mark.services
@pytest.mark.timeout(300)
def test_seaweedfs_handed_a_held_s3_port_starts_on_another(tmp_path, monkeypatch, capfd):
    import infra.storage
    from infra.storage import ArtifactStore, SeaweedFSServer

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    held = _listener()
    h = held.getsockname()[1]
    calls = _first_pick_held(monkeypatch, infra.storage, h)
    try:
        with SeaweedFSServer(data_dir=tmp_path / "data", log_dir=tmp_path / "logs") as srv:
            assert srv.s3_port != h and calls == [11, 11]  # S3's port and its 10 others, picked twice
            assert h not in srv.ports.values()
            store = ArtifactStore(srv.settings(), "ports")
            f = tmp_path / "x.txt"
            f.write_text("stored")
            store.put_file(f, "x.txt")
            store.get_file("x.txt", tmp_path / "back.txt")
            assert (tmp_path / "back.txt").read_text() == "stored"
    finally:
        held.close()
    first_log = (tmp_path / "logs" / f"seaweedfs-{h}.log").read_text()
    assert f"port {h}" in first_log and "not available" in first_log
    warnings = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: SeaweedFS: port {h} on 127.0.0.1 was taken"), \
        warnings


@pytest.mark.services
@pytest.mark.timeout(300)
def test_prefect_server_handed_a_held_port_starts_on_another(tmp_path, monkeypatch, capfd):
    import httpx

    import infra.orchestration
    from infra.orchestration import PrefectServer

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    held = _listener()
    h = held.getsockname()[1]
    _first_pick_held(monkeypatch, infra.orchestration, h)
    try:
        with PrefectServer(log_dir=tmp_path / "logs") as srv:
            assert srv.port != h and srv.api_url == f"http://127.0.0.1:{srv.port}/api"
            assert httpx.get(f"{srv.api_url}/health", timeout=10).status_code == 200
    finally:
        held.close()
    assert f"Port {h} is already in use" in (tmp_path / "logs" / f"prefect-{h}.log").read_text()
    warnings = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: Prefect server: port {h} on 127.0.0.1 was "
                                                         "taken"), warnings


def test_a_prefect_port_set_by_hand_is_refused_not_changed(tmp_path, monkeypatch):
    from infra.orchestration import PrefectServer

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    held = _listener()
    h = held.getsockname()[1]
    try:
        with pytest.raises(ServiceError, match=rf"^Prefect server: port {h} on 127.0.0.1 is in use \(choose another "
                                               r"--prefect-port\)$"):
            PrefectServer(port=h, log_dir=tmp_path / "logs").start()
    finally:
        held.close()
    assert not (tmp_path / "logs").exists()  # nothing was started
