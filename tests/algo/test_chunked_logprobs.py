"""Chunked log-probs (LM head applied to a chunk of positions under checkpointing) equal the full-logits path.

On the tiny random Llama (V = 49152): the same loss and the same gradients for every loss type, with and
without LoRA, with the KL-to-reference term; the trainer gives the same step metrics on both paths; and
no [*, V] tensor larger than one chunk exists in the chunked path (while the full path holds [B, L-1, V]).
"""

from pathlib import Path

import pytest
import torch

from rao_core.samples import Sample
from rao_core.train import LoraSettings, TrainerConfig, train
from rao_core.train.loss import chunked_token_logprobs, model_hidden_states, policy_loss, token_logprobs

B, L = 3, 13




def _model(tiny: Path, lora: bool):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32, attn_implementation="sdpa")
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights=False, task_type="CAUSAL_LM"))
    return model.train()


def _batch(vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (B, L), generator=g)
    attn = torch.ones(B, L, dtype=torch.long)
    attn[1, 10:] = 0  # right padding, as collate makes it
    attn[2, 7:] = 0
    mask = torch.zeros(B, L)
    mask[:, 4:] = 1.0
    mask *= attn
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": mask, "coef": torch.tensor([1.0, -0.5, 2.0])}


def _lp(model, batch, chunk: int | None, temperature: float) -> torch.Tensor:
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    if chunk is None:
        return token_logprobs(model(**inputs).logits, batch["input_ids"], temperature)
    head = model.get_output_embeddings()
    return chunked_token_logprobs(model_hidden_states(model, head, **inputs), head, batch["input_ids"],
                                  temperature, chunk)


def _loss_and_grads(model, batch, loss_type: str, chunk: int | None, kl_coef: float, behaviour, ref_lp):
    model.zero_grad(set_to_none=True)
    lp = _lp(model, batch, chunk, 0.7)
    loss, st = policy_loss(lp, behaviour, batch["loss_mask"], batch["coef"], loss_type=loss_type,
                           ref_logprobs=ref_lp, kl_coef=kl_coef)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}
    return lp.detach(), loss.detach(), st, grads


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("loss_type, kl_coef", [("reinforce", 0.0), ("ppo", 0.0), ("cispo", 0.0), ("sft", 0.0),
                                                ("ppo", 0.3)])
def test_chunked_equals_full_loss_and_gradients(tiny, lora, loss_type, kl_coef):
    model = _model(tiny, lora)
    batch = _batch(model.config.vocab_size)
    with torch.no_grad():
        ref_full = _lp(model, batch, None, 0.7)
        # behaviour log-probs off by +-0.4 so that ppo/cispo clip some tokens
        noise = 0.4 * torch.sign(torch.randn(B, L, generator=torch.Generator().manual_seed(2)))
        behaviour = ref_full + noise
        ref_lp = (ref_full - 0.2) if kl_coef > 0 else None
        ref_chunked = _lp(model, batch, 4, 0.7)  # no-grad path (the reference model's)
    torch.testing.assert_close(ref_chunked, ref_full, rtol=0, atol=1e-5)
    lp_f, loss_f, st_f, g_f = _loss_and_grads(model, batch, loss_type, None, kl_coef, behaviour, ref_lp)
    for chunk in (1, 5, 10_000):  # 1 row-position per chunk, a ragged split, one chunk
        lp_c, loss_c, st_c, g_c = _loss_and_grads(model, batch, loss_type, chunk, kl_coef, behaviour, ref_lp)
        torch.testing.assert_close(lp_c, lp_f, rtol=0, atol=1e-5)
        assert float(loss_c) == pytest.approx(float(loss_f), abs=1e-5)
        assert float(st_c.clipped_tokens) == float(st_f.clipped_tokens)
        assert float(st_c.ref_kl_sum) == pytest.approx(float(st_f.ref_kl_sum), abs=1e-5)
        assert g_c.keys() == g_f.keys() and g_f
        for n in g_f:
            torch.testing.assert_close(g_c[n], g_f[n], rtol=1e-4, atol=1e-5, msg=lambda m, n=n: f"{n}: {m}")
    assert sum(float(g.abs().sum()) for g in g_f.values()) > 1e-3  # the comparison is not between zeros
    if loss_type in ("ppo", "cispo"):
        assert float(st_f.clipped_tokens) > 0


def test_no_logits_bigger_than_one_chunk(tiny):
    """Every LM-head output (forward and backward recompute) is at most one chunk; nothing of width V is
    kept for backward. The full path, measured the same way, keeps [B, L-1, V]."""
    model = _model(tiny, lora=False)
    V = model.config.vocab_size
    batch = _batch(V)
    head = model.get_output_embeddings()
    head_out: list[tuple[int, ...]] = []
    hook = head.register_forward_hook(lambda _m, _a, out: head_out.append(tuple(out.shape)))

    def run(chunk: int | None) -> int:
        """Largest number of elements of a tensor of width V saved for backward (views of the [V, H] weight,
        which cost nothing, left out)."""
        widest = [0]
        weight = head.weight.untyped_storage().data_ptr()

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.dim() >= 2 and t.shape[-1] == V and t.untyped_storage().data_ptr() != weight:
                widest[0] = max(widest[0], t.numel())
            return t

        head_out.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            lp = _lp(model, batch, chunk, 1.0)
        (lp * batch["loss_mask"]).sum().backward()
        return widest[0]

    try:
        saved_full = run(None)
        assert saved_full >= B * (L - 1) * V and max(s[1] for s in head_out) == L
        chunk = 7  # tokens: 7 // B = 2 positions per chunk
        saved_chunked = run(chunk)
    finally:
        hook.remove()
    assert saved_chunked == 0  # checkpointed chunks keep only their [B, c, H] input
    calls = [s for s in head_out if s[1] > 0]
    # forward: ceil((L-1)/2) chunks, and backward recomputes each once
    assert len(calls) == 2 * -(-(L - 1) // 2)
    assert max(s[0] * s[1] for s in calls) <= max(chunk, B) and all(s[-1] == V for s in calls)
    assert [s for s in head_out if s[1] == 0] == [(B, 0, V)]  # the model's own head call saw no positions


def test_masked_chunked_logprobs_compute_only_the_trained_tokens(tiny):
    """With ``mask``: the LM head sees only the masked positions; their log-probs and the loss gradients
    equal the unmasked path's, and unmasked tokens are 0."""
    model = _model(tiny, lora=False)
    batch = _batch(model.config.vocab_size)
    head = model.get_output_embeddings()
    rows: list[int] = []
    hook = head.register_forward_hook(lambda _m, _a, out: rows.append(out.shape[0] * out.shape[1]))
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    m = batch["loss_mask"]
    try:
        grads = []
        for mask in (None, m):
            model.zero_grad(set_to_none=True)
            rows.clear()
            lp = chunked_token_logprobs(model_hidden_states(model, head, **inputs), head, batch["input_ids"], 0.7,
                                        4, mask=mask)
            (lp * m * batch["coef"][:, None]).sum().backward()
            grads.append(({n: p.grad.clone() for n, p in model.named_parameters()}, lp.detach(), sum(rows)))
    finally:
        hook.remove()
    (g_all, lp_all, rows_all), (g_m, lp_m, rows_m) = grads
    torch.testing.assert_close(lp_m * m, lp_all * m, rtol=0, atol=1e-5)
    assert float(lp_m[m == 0].abs().sum()) == 0.0 and float((lp_all[:, 1:][m[:, 1:] == 0]).abs().sum()) > 0
    for n in g_all:
        torch.testing.assert_close(g_m[n], g_all[n], rtol=1e-4, atol=5e-5)  # summation order only
    # LM-head rows, forward + backward recompute: every position vs the masked tokens only
    assert rows_all == 2 * B * (L - 1) and rows_m == 2 * int(m[:, 1:].sum())


def _samples(vocab: int) -> list[Sample]:
    g = torch.Generator().manual_seed(3)
    out = []
    for k in range(4):
        n = 9 + 2 * k
        ids = torch.randint(3, vocab, (n,), generator=g).tolist()
        mask = [0] * 4 + [1] * (n - 4)
        out.append(Sample(tree_id=f"t{k}", node_id="r", group_id="g", depth=k % 2, token_ids=ids,
                          assistant_mask=mask, behaviour_logprobs=[-9.0 - 0.5 * k if m else 0.0 for m in mask],
                          success=float(k % 2), reward=float(k % 2), baseline=0.5, advantage=(k % 2) - 0.5,
                          weight=1.0))
    return out


@pytest.mark.parametrize("lora", [False, True])
def test_trainer_same_step_on_both_paths(tiny, tmp_path, lora):
    """One PPO step with a KL-to-reference term: the trainer's metrics agree between the full-logits path
    and the chunked one (policy and reference log-probs), and the manifest says which path ran."""
    samples = _samples(49152)
    kw = dict(loss_type="ppo", lr=1e-3, kl_coef=0.2, micro_batch_size=2, shuffle=False,
              lora=LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"]) if lora else None)
    full = train(samples, tiny, tmp_path / "full", TrainerConfig(logprob_chunk_tokens=None, **kw))
    chunked = train(samples, tiny, tmp_path / "chunked", TrainerConfig(logprob_chunk_tokens=5, **kw))
    assert full.manifest["logprob_path"] == "full logits"
    assert chunked.manifest["logprob_path"] == "chunked (5 tokens)"
    a, b = full.metrics[0], chunked.metrics[0]
    for k in ("train/loss", "train/pg_loss", "train/kl_ref", "train/kl_mismatch", "train/ratio_mean"):
        assert b[k] == pytest.approx(a[k], abs=1e-5), k
    assert b["train/grad_norm"] == pytest.approx(a["train/grad_norm"], rel=1e-4)
    assert a["train/kl_mismatch"] > 0.1 and a["train/grad_norm"] > 0  # off-policy: a real, non-zero update
