"""The HF sampler (sage_unsloth.eval.sampling.HFSampler): its draws are those of the model's distribution, checked
against probabilities computed here from the equations and from plain forwards of the model, and a completion
depends on (seed, problem, sample index) alone, not on how rows are batched."""

import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sage_unsloth.eval.sampling import MIN_ROWS, sample_tokens, sample_uniforms


# ------------------------------------------------------------------------------------------------ no model
def test_uniforms_depend_on_seed_sample_and_step_only():
    full = sample_uniforms(11, np.arange(16), 10)
    assert full.shape == (16, 10) and (full >= 0).all() and (full < 1).all()
    np.testing.assert_array_equal(sample_uniforms(11, [3, 7], 10), full[[3, 7]])  # any subset of samples
    np.testing.assert_array_equal(sample_uniforms(11, np.arange(16), 4), full[:, :4])  # any number of steps
    assert not np.array_equal(sample_uniforms(12, np.arange(16), 10), full)
    assert len(np.unique(full)) == full.size  # no two (sample, step) share a draw


def test_uniforms_are_uniform_and_independent():
    u = sample_uniforms(5, np.arange(4000), 50)
    counts, _ = np.histogram(u, bins=20, range=(0, 1))
    expected = u.size / 20
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 45  # 19 degrees of freedom: p < 1e-3 above 43.8
    lag = np.corrcoef(u[:, :-1].ravel(), u[:, 1:].ravel())[0, 1]  # step t against step t+1
    across = np.corrcoef(u[:-1].ravel(), u[1:].ravel())[0, 1]  # sample j against sample j+1
    assert abs(lag) < 0.01 and abs(across) < 0.01


def reference_probs(logits, temperature, top_p=1.0, min_p=0.0):
    """The sampling distribution from its definition, in plain Python floats."""
    scaled = [x / temperature for x in logits]
    top = max(scaled)
    weights = [math.exp(x - top) for x in scaled]
    total = sum(weights)
    probs = [w / total for w in weights]
    if top_p < 1.0:
        order = sorted(range(len(probs)), key=lambda i: (-probs[i], i))
        kept, mass = set(), 0.0
        for i in order:
            if mass >= top_p:
                break
            kept.add(i)
            mass += probs[i]
        probs = [p if i in kept else 0.0 for i, p in enumerate(probs)]
    if min_p > 0.0:
        floor = min_p * max(probs)
        probs = [p if p >= floor else 0.0 for p in probs]
    total = sum(probs)
    return [p / total for p in probs]


@pytest.mark.parametrize(
    "temperature,top_p,min_p", [(1.0, 1.0, 0.0), (0.6, 1.0, 0.0), (1.0, 0.7, 0.0), (1.3, 1.0, 0.15)]
)
def test_token_frequencies_match_the_distribution(temperature, top_p, min_p):
    rng = np.random.default_rng(0)
    logits = torch.tensor(rng.normal(0, 1.5, size=(1, 12)), dtype=torch.float32)
    draws = 40000
    u = torch.from_numpy(sample_uniforms(3, np.arange(draws), 1)[:, 0])
    tokens = sample_tokens(logits.expand(draws, -1), u, temperature, top_p, min_p)
    freq = np.bincount(tokens.numpy(), minlength=12) / draws
    probs = np.array(reference_probs(logits[0].tolist(), temperature, top_p, min_p))
    assert freq[probs == 0].sum() == 0  # a token outside the support is never drawn
    sigma = np.sqrt(probs * (1 - probs) / draws)
    assert np.all(np.abs(freq - probs) <= 4.5 * sigma + 1e-12), (freq, probs)
    # and the draw itself is the inverse CDF of the row's uniform (over the tokens by falling probability
    # once top-p sorts them)
    order = sorted(range(12), key=lambda i: (-probs[i], i)) if top_p < 1.0 else list(range(12))
    cdf = np.cumsum(probs[order])
    expected = [order[int(np.searchsorted(cdf, x * cdf[-1], side="right"))] for x in u[:2000].tolist()]
    assert tokens[:2000].tolist() == expected


def test_greedy_is_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])
    assert sample_tokens(logits, torch.tensor([0.99, 0.01]), 0.0).tolist() == [1, 0]


# ------------------------------------------------------------------------------------------------ the model
def _cfg(tiny_model_dir, **overrides):
    from sage_unsloth.eval.config import EvalConfig

    base = EvalConfig(
        checkpoints=[str(tiny_model_dir)],
        n=8,
        temperature=1.0,
        top_p=1.0,
        max_tokens=12,
        max_model_len=512,
        backend="hf",
        dtype="float32",
        stop=[],
    )
    return replace(base, **overrides)


def _sampler(tiny_model_dir, cfg, **kwargs):
    from sage_unsloth.eval.sampling import HFSampler, resolve_checkpoint

    return HFSampler(resolve_checkpoint(str(tiny_model_dir)), cfg, **kwargs)


def _prompts(sampler, texts):
    from sage_unsloth.eval.sampling import render_prompts

    return render_prompts(
        sampler.tokenizer, [SimpleNamespace(problem=t) for t in texts], sampler.cfg.user_template
    )


def _next_token_probs(model, ids, temperature, top_p=1.0):
    """Plain full forward of ``ids`` (no cache), the last position's distribution from its definition."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].double()
    return np.array(reference_probs(logits.tolist(), temperature, top_p))


def _check_counts(tokens, expected, variance, label):
    """Observed token counts against their expectation and variance (per token, and chi-square over the tokens
    expected >= 5 times, the rest pooled)."""
    count = np.bincount(np.asarray(tokens), minlength=len(expected))[: len(expected)].astype(float)
    assert count[expected == 0].sum() == 0, f"{label}: a token outside the top-p set was drawn"
    worst = np.max(np.abs(count - expected) - 5 * np.sqrt(variance))
    assert worst <= 1, f"{label}: counts off the model's distribution by {worst:.1f} beyond 5 sigma"
    big = expected >= 5
    observed = np.append(count[big], count[~big].sum())
    wanted = np.append(expected[big], expected[~big].sum())
    spread = np.append(variance[big], variance[~big].sum())
    keep = spread > 0
    chi2 = (((observed - wanted) ** 2)[keep] / spread[keep]).sum()
    dof = keep.sum() - 1
    assert chi2 < dof + 5 * np.sqrt(2 * dof), f"{label}: chi2 {chi2:.1f} on {dof} degrees of freedom"


@pytest.mark.parametrize("temperature,top_p", [(0.7, 1.0), (1.0, 0.8)])
def test_first_and_second_tokens_follow_the_model(tiny_model_dir, temperature, top_p):
    """First tokens (the prefill) and second tokens given the first (the repeated KV cache) of 4000 samples of
    two prompts side by side, against the softmax of plain forwards of the model: the second tokens' counts
    against sum over samples of p(token | prompt, the sample's first token)."""
    n = 4000
    cfg = _cfg(tiny_model_dir, n=n, max_tokens=2, temperature=temperature, top_p=top_p)
    sampler = _sampler(tiny_model_dir, cfg)
    prompts = _prompts(sampler, ["What is 5+8+6+7?", "What is 9+8+6+7?"])
    assert len(prompts[0]) == len(prompts[1])  # one pass: two problems' rows side by side
    out = sampler.generate(prompts, [101, 202])
    eos = sampler.eos_ids[0]  # the pad token too here: a row that drew it keeps no id for it
    for prompt, samples in zip(prompts, out):
        ids = [s.token_ids + (eos,) * (2 - len(s.token_ids)) for s in samples]
        assert len(ids) == n and all(len(i) == 2 for i in ids)
        probs = _next_token_probs(sampler.model, prompt, temperature, top_p)
        _check_counts([i[0] for i in ids], n * probs, n * probs * (1 - probs), "first")
        expected = np.zeros_like(probs)
        variance = np.zeros_like(probs)
        second = []
        for first in sorted({i[0] for i in ids if i[0] != eos}):
            rows = [i[1] for i in ids if i[0] == first]
            cond = _next_token_probs(sampler.model, prompt + [first], temperature, top_p)
            expected += len(rows) * cond
            variance += len(rows) * cond * (1 - cond)
            second += rows
        _check_counts(second, expected, variance, "second")


def test_completions_do_not_depend_on_batching(tiny_model_dir):
    """The same (seed, problem, sample index) gives the same completion in passes of MIN_ROWS rows or of
    thousands, alone or beside other problems, for n = 12 or as the first 12 of n = 40; rows stop at a stop
    string at different steps, so finished rows leave the passes (and padding rows fill small ones)."""
    cfg = _cfg(tiny_model_dir, n=40, max_tokens=16, stop=["e"])
    big = _sampler(tiny_model_dir, cfg)
    prompts = _prompts(big, ["What is 5+8+6+7?", "What is 9+8+6+7?", "Add 12 and 30.", "What is 7+7+6+5?"])
    seeds = [1, 2, 3, 4]
    reference = big.generate(prompts, seeds)
    small = _sampler(tiny_model_dir, cfg, rows_per_forward=MIN_ROWS)
    assert small.generate(prompts, seeds) == reference
    one_by_one = [big.generate([p], [s])[0] for p, s in zip(prompts, seeds)]
    assert one_by_one == reference
    fewer = _sampler(tiny_model_dir, replace(cfg, n=12), rows_per_forward=4096)
    assert [group for group in fewer.generate(prompts[::-1], seeds[::-1])] == [
        g[:12] for g in reference[::-1]
    ]
    lengths = {s.tokens for group in reference for s in group}
    assert len(lengths) > 4 and max(lengths) == 16  # rows ended at many different steps
    assert len({s.text for group in reference for s in group}) > 100


def test_rows_stop_at_the_first_stop_string_and_at_eos(tiny_model_dir):
    cfg = _cfg(tiny_model_dir, n=64, max_tokens=20, stop=["e", "a"])
    sampler = _sampler(tiny_model_dir, cfg)
    tok = sampler.tokenizer
    (samples,) = sampler.generate(_prompts(sampler, ["What is 5+8+6+7?"]), [9])
    stopped = 0
    for s in samples:
        ids = list(s.token_ids)
        assert s.tokens == len(ids) and "e" not in s.text and "a" not in s.text
        full = tok.decode(ids, skip_special_tokens=True)
        assert all("e" not in tok.decode(ids[:k]) and "a" not in tok.decode(ids[:k]) for k in range(len(ids)))
        if "e" in full or "a" in full:  # ended by the stop string, in its last token (else EOS or length)
            assert "e" in tok.decode(ids[-1:]) or "a" in tok.decode(ids[-1:]) or len(ids) > 1
            stopped += 1
        assert full.startswith(s.text)
    assert stopped > 10


def test_eos_ends_a_row(tiny_model_dir):
    """A model whose EOS is likely: rows that drew it end there (EOS is the pad token here, not counted)."""
    cfg = _cfg(tiny_model_dir, n=64, max_tokens=10)
    sampler = _sampler(tiny_model_dir, cfg)
    prompt = _prompts(sampler, ["What is 5+8+6+7?"])[0]
    with torch.no_grad():  # make EOS the likeliest next token everywhere: raise its output bias
        head = sampler.model.get_output_embeddings()
        if head.bias is None:
            head.bias = torch.nn.Parameter(torch.zeros(head.weight.shape[0]))
        head.bias[sampler.eos_ids[0]] = 2.5
    (samples,) = sampler.generate([prompt], [3])
    lengths = [s.tokens for s in samples]
    assert min(lengths) < cfg.max_tokens and any(length == cfg.max_tokens for length in lengths)
    assert all(sampler.eos_ids[0] not in s.token_ids for s in samples)
