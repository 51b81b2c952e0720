"""opforge.patch on transformers models: tiny random Llama, Mistral, Qwen2, Qwen3, Gemma and Gemma2
configs built here (no downloads), each patched next to an unpatched deep copy with the same
weights. CPU cases run everywhere; the ``gpu`` cases skip without CUDA, ``compile`` marks the
torch.compile ones."""

from __future__ import annotations

import copy
import gc
import shutil
import subprocess
import sys
import weakref

import pytest
import torch

transformers = pytest.importorskip("transformers")

import opforge  # noqa: E402
from conftest import HAS_GPU  # noqa: E402
from opforge.integrations import transformers as integration  # noqa: E402

VOCAB, HIDDEN, LAYERS = 256, 64, 2
FAMILIES = {
    # model_type: (config class, model class, config overrides); small windows so generation crosses them
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 8}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 16}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 16, "sliding_window": 8,
                                                     "query_pre_attn_scalar": 16}),
}
GEMMA = {"gemma", "gemma2"}


def expected_calls(family: str) -> dict[str, int]:
    """opforge ops and how often one forward of a LAYERS-layer model calls each."""
    gemma = "gemma_" if family in GEMMA else ""
    norm, add_norm = f"{gemma}rmsnorm", f"{gemma}fused_add_rmsnorm"
    norms_per_layer = {"qwen3": 3, "gemma2": 3}.get(family, 1)  # + q/k norms; + Gemma2's post norms
    return {norm: LAYERS * norms_per_layer + 1, add_norm: LAYERS,
            "gelu_tanh_and_mul" if family in GEMMA else "silu_and_mul": LAYERS}


def build(family: str, rng, dtype=torch.float32, head="ForCausalLM", **overrides):
    config_name, model_name, extra = FAMILIES[family]
    config = getattr(transformers, config_name)(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0,
        **{**extra, **overrides})
    cls = getattr(transformers, model_name if head == "ForCausalLM" else model_name.replace("ForCausalLM", head))
    with torch.random.fork_rng():
        torch.manual_seed(rng.seed)
        model = cls(config)
    # Fresh weights from the test's generator. Norm weights are spread around their neutral value
    # (Gemma's around 0, applied as 1 + w; the others around 1), so the wrong form is caught.
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.copy_(rng.randn(*p.shape, scale=0.2) + (0.0 if family in GEMMA else 1.0))
            else:
                p.copy_(rng.randn(*p.shape, scale=0.08))
    return model.to(dtype).eval()


def pair(family, rng, dtype=torch.float32, **kw):
    plain = build(family, rng, dtype, **kw)
    patched = copy.deepcopy(plain)
    assert opforge.patch(patched) is patched
    return plain, patched


def tokens(rng, batch=2, length=12, device="cpu"):
    return (rng.uniform(batch, length, low=1, high=VOCAB - 1e-3).long()).to(device)


def logits_of(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def module_types(model):
    return {name: type(m) for name, m in model.named_modules()}


def assert_unchanged(model, state, types):
    after = model.state_dict()
    assert after.keys() == state.keys()
    assert all(after[k] is state[k] or torch.equal(after[k], state[k]) for k in state)
    assert module_types(model) == types


# --- numerics --------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_fp32_logits_and_hidden_states_match(family, rng):
    """fp32: patched and plain agree to fp32 rounding, in the logits and in every recorded hidden
    state; the hidden states also show no layer overwrote its input (the previous layer's output,
    which output_hidden_states keeps)."""
    plain, patched = pair(family, rng)
    ids = tokens(rng)
    with torch.no_grad():
        want = plain(input_ids=ids, output_hidden_states=True)
        got = patched(input_ids=ids, output_hidden_states=True)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-5 * want.logits.abs().max().item())
    assert len(got.hidden_states) == LAYERS + 1
    for g, w in zip(got.hidden_states, want.hidden_states):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5 * w.abs().max().item())


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_logits_match_within_bf16_rounding(family, rng):
    """bf16: patched logits agree with plain ones within a few bf16 ulps of the largest logit, and
    are no further from the fp32 model's logits than plain bf16 is (allowing 2x: each rounds
    at different places)."""
    plain32 = build(family, rng)
    plain = copy.deepcopy(plain32).to(torch.bfloat16)
    patched = opforge.patch(copy.deepcopy(plain))
    ids = tokens(rng)
    exact, want, got = logits_of(plain32, ids), logits_of(plain, ids), logits_of(patched, ids)
    scale = exact.abs().max().item()
    torch.testing.assert_close(got, want, rtol=0, atol=0.03 * scale)
    err_plain, err_patched = (want - exact).abs().max().item(), (got - exact).abs().max().item()
    assert err_patched <= 2 * err_plain + 2**-8 * scale, (err_patched, err_plain)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_matches(family, rng):
    plain, patched = pair(family, rng)
    ids = tokens(rng, batch=2, length=6)
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=32)
    want, got = plain.generate(ids, **kw), patched.generate(ids, **kw)
    assert want.shape == (2, 6 + 32)
    assert torch.equal(got, want)


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma2"])
def test_generation_with_a_static_cache(family, rng):
    plain, patched = pair(family, rng)
    ids = tokens(rng, batch=2, length=6)
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12)
    want = plain.generate(ids, **kw)
    got = patched.generate(ids, cache_implementation="static", **kw)
    assert torch.equal(got, want)


def test_bare_model_is_patched(rng):
    plain, patched = pair("llama", rng, head="Model")
    ids = tokens(rng)
    with torch.no_grad():
        want, got = plain(input_ids=ids).last_hidden_state, patched(input_ids=ids).last_hidden_state
    assert isinstance(patched.layers[0], integration._Patched) and isinstance(patched.norm, integration._Patched)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_layer_called_with_positional_arguments(family, rng):
    """A patched layer binds positional arguments as the original forward does (defaults included)."""
    plain, patched = pair(family, rng)
    x = rng.randn(2, 5, HIDDEN)
    pe = plain.model.rotary_emb(x, torch.arange(5).unsqueeze(0))
    # The originals' parameter orders differ: Llama (h, attention_mask, position_ids, ...,
    # position_embeddings), Gemma2 (h, position_embeddings, attention_mask, ...).
    args = (None, None, None, False, pe) if family == "llama" else (pe, None)
    with torch.no_grad():
        want, got = plain.model.layers[0](x.clone(), *args), patched.model.layers[0](x.clone(), *args)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * want.abs().max().item())
    with pytest.raises(TypeError, match="multiple values"):
        patched.model.layers[0](x, *args, **{"attention_mask" if family == "llama" else "position_embeddings": None})


# --- what the patch changes ------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_forward_runs_through_opforge(family, rng, monkeypatch):
    """Each norm, fused add and gated activation is an opforge call, and none of the original
    RMSNorm / MLP / decoder-layer forwards runs."""
    plain, patched = pair(family, rng)
    calls = {}
    for name in ("rmsnorm", "gemma_rmsnorm", "fused_add_rmsnorm", "gemma_fused_add_rmsnorm", "silu_and_mul",
                 "gelu_and_mul", "gelu_tanh_and_mul"):
        def counted(*a, _op=getattr(opforge, name), _name=name, **k):
            calls[_name] = calls.get(_name, 0) + 1
            return _op(*a, **k)
        monkeypatch.setattr(opforge, name, counted)
    module = sys.modules[type(plain.model).__module__]
    prefix = type(plain.model).__name__[:-len("Model")]
    for suffix in ("RMSNorm", "MLP", "DecoderLayer"):
        def refuse(*a, _suffix=suffix, **k):
            raise AssertionError(f"the original {prefix}{_suffix}.forward ran")
        monkeypatch.setattr(getattr(module, prefix + suffix), "forward", refuse)
    logits_of(patched, tokens(rng))
    assert calls == expected_calls(family)
    norms = [m for m in patched.modules() if isinstance(m, getattr(module, prefix + "RMSNorm"))]
    assert norms and all(isinstance(m, integration._Patched) for m in norms)


@pytest.mark.parametrize("family", FAMILIES)
def test_gate_and_up_are_merged_and_freed(family, rng):
    plain = build(family, rng)
    before = dict(plain.named_parameters())
    old = [weakref.ref(m) for layer in plain.model.layers for m in (layer.mlp.gate_proj, layer.mlp.up_proj)]
    old += [weakref.ref(m.weight) for layer in plain.model.layers for m in (layer.mlp.gate_proj, layer.mlp.up_proj)]
    expected = {i: torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]).detach()
                for i, layer in enumerate(plain.model.layers)}
    opforge.patch(plain)
    after = dict(plain.named_parameters())
    gone = {k for k in before if ".gate_proj." in k or ".up_proj." in k}
    new = set(after) - set(before)
    assert len(gone) == 2 * LAYERS and set(before) - set(after) == gone
    assert new == {f"model.layers.{i}.mlp.gate_up_proj.weight" for i in range(LAYERS)}
    assert sum(p.numel() for p in after.values()) == sum(p.numel() for p in before.values())
    for k in set(before) - gone:  # everything else is the same parameter object
        assert after[k] is before[k], k
    for i, layer in enumerate(plain.model.layers):
        assert not hasattr(layer.mlp, "gate_proj") and not hasattr(layer.mlp, "up_proj")
        assert torch.equal(layer.mlp.gate_up_proj.weight, expected[i])
    del before
    gc.collect()
    assert all(ref() is None for ref in old), "the old gate/up modules or weights are still referenced"


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_patching_twice_is_a_no_op(family, rng):
    plain, patched = pair(family, rng)
    ids = tokens(rng)
    first = logits_of(patched, ids)
    state, types, params = patched.state_dict(), module_types(patched), dict(patched.named_parameters())
    assert opforge.patch(patched) is patched
    assert_unchanged(patched, state, types)
    again = dict(patched.named_parameters())
    assert again.keys() == params.keys() and all(again[k] is params[k] for k in params)
    assert torch.equal(logits_of(patched, ids), first)


def test_patched_forward_refuses_grad(rng):
    """The ops have no backward: outside no_grad the patched model says so instead of returning
    results with no gradient."""
    _, patched = pair("llama", rng)
    with pytest.raises(ValueError, match="no backward"):
        patched(input_ids=tokens(rng))


# --- refusals leave the model as it was ------------------------------------------------------


def test_unsupported_architecture_is_refused_unchanged():
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=64,
                                                                 n_positions=32)).eval()
    state, types = model.state_dict(), module_types(model)
    with pytest.raises(ValueError) as info:
        opforge.patch(model)
    message = str(info.value)
    assert "gpt2" in message and "not changed" in message
    for name in ("Llama", "Mistral", "Qwen2", "Qwen3", "Gemma", "Gemma2"):
        assert name in message
    assert_unchanged(model, state, types)


@pytest.mark.parametrize("family, attr", [("llama", "hidden_act"), ("gemma2", "hidden_activation")])
def test_unsupported_activation_is_refused_unchanged(family, attr, rng):
    model = build(family, rng, **{attr: "relu"})
    state, types = model.state_dict(), module_types(model)
    with pytest.raises(ValueError, match=rf"{attr}='relu'.*accepted: silu"):
        opforge.patch(model)
    assert_unchanged(model, state, types)


def test_a_foreign_module_deep_inside_refuses_the_whole_model(rng):
    """Checks come before changes: a replaced projection in the last layer leaves the first
    layer, the final norm and everything else unpatched."""
    model = build("llama", rng)

    class QuantizedLinear(torch.nn.Linear):
        pass

    last = model.model.layers[-1].mlp
    foreign = QuantizedLinear(HIDDEN, 96, bias=False)
    foreign.weight = last.up_proj.weight
    last.up_proj = foreign
    state, types = model.state_dict(), module_types(model)
    with pytest.raises(ValueError, match=f"layers.{LAYERS - 1}.mlp gate_proj / up_proj are Linear / QuantizedLinear"):
        opforge.patch(model)
    assert_unchanged(model, state, types)


def test_instance_level_forward_is_refused_unchanged(rng):
    model = build("qwen3", rng)
    k_norm = model.model.layers[0].self_attn.k_norm
    k_norm.forward = k_norm.forward  # what accelerate's hooks and other patches leave behind
    state, types = model.state_dict(), module_types(model)
    with pytest.raises(ValueError, match=r"layers.0.self_attn.k_norm has its forward replaced"):
        opforge.patch(model)
    assert_unchanged(model, state, types)


def test_float64_model_is_refused_unchanged(rng):
    model = build("mistral", rng, torch.float64)
    state, types = model.state_dict(), module_types(model)
    with pytest.raises(ValueError, match=r"float64.*take float16, bfloat16 or float32"):
        opforge.patch(model)
    assert_unchanged(model, state, types)


def test_importing_opforge_does_not_import_transformers():
    code = ("import sys, opforge\n"
            "assert 'transformers' not in sys.modules\n"
            "assert callable(opforge.patch) and 'patch' in opforge.__all__\n"
            "assert 'transformers' not in sys.modules, 'resolving opforge.patch imported transformers'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


# --- torch.compile and CUDA graphs -----------------------------------------------------------


def _cpu_compiler_missing() -> str | None:
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        compiler = get_cpp_compiler()
    except Exception as e:  # the private helper moved or found nothing
        return f"no C++ compiler for inductor: {e}"
    return None if shutil.which(compiler) else f"inductor's C++ compiler {compiler!r} is not installed"


def static_decode(model, ids, steps, compile_kwargs=None):
    """Greedy decoding through a static cache: the prefill eagerly, each decode step through
    torch.compile(**compile_kwargs) when given. Returns (tokens, last step's logits)."""
    cache = transformers.StaticCache(config=model.config, max_cache_len=ids.shape[1] + steps + 1)

    def step(tok, pos):
        out = model(input_ids=tok, position_ids=pos.view(1, 1), past_key_values=cache, use_cache=True)
        return out.logits[:, -1].float()

    run = torch.compile(step, **compile_kwargs) if compile_kwargs is not None else step
    with torch.no_grad():
        n = ids.shape[1]
        logits = model(input_ids=ids, position_ids=torch.arange(n, device=ids.device).view(1, -1),
                       past_key_values=cache, use_cache=True).logits[:, -1].float()
        out = []
        for k in range(steps):
            tok = logits.argmax(-1, keepdim=True)
            out.append(tok)
            if compile_kwargs and compile_kwargs.get("mode") == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()
            # A CUDA-graph output is overwritten by the next replay: keep a copy.
            logits = run(tok, torch.tensor([n + k], device=ids.device)).clone()
    return torch.cat(out, dim=1), logits


@pytest.mark.compile
def test_compiled_static_cache_decode_on_cpu(rng):
    """The patched model's decode step compiled whole (inductor, fullgraph) on the CPU gives the
    tokens and logits of the eager patched model."""
    problem = _cpu_compiler_missing()
    if problem:
        pytest.skip(problem)
    torch._dynamo.reset()
    _, patched = pair("llama", rng)
    ids = tokens(rng, batch=2, length=5)
    want, want_logits = static_decode(patched, ids, 4)
    got, got_logits = static_decode(patched, ids, 4, dict(fullgraph=True, dynamic=False))
    torch._dynamo.reset()
    assert torch.equal(got, want)
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-4, atol=1e-4)


gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA device and an opforge build with CUDA kernels")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma2"])
def test_bf16_on_cuda_matches(family, rng):
    plain = build(family, rng, torch.bfloat16).cuda()
    patched = opforge.patch(copy.deepcopy(plain))
    ids = tokens(rng, device="cuda")
    want, got = logits_of(plain, ids), logits_of(patched, ids)
    torch.testing.assert_close(got, want, rtol=0, atol=0.03 * want.abs().max().item())
    assert next(patched.parameters()).is_cuda


@pytest.mark.gpu
@gpu
def test_decode_step_captured_in_a_cuda_graph(rng):
    """One decode step of the patched model (static cache) captured by torch.cuda.graph and
    replayed gives the logits of the same steps run eagerly."""
    plain, patched = pair("llama", rng, torch.bfloat16)
    patched.cuda()
    ids = tokens(rng, batch=2, length=6, device="cuda")
    forced = tokens(rng, batch=2, length=4, device="cuda")

    def prefilled():
        cache = transformers.StaticCache(config=patched.config, max_cache_len=16)
        with torch.no_grad():
            patched(input_ids=ids, position_ids=torch.arange(6, device="cuda").view(1, -1), past_key_values=cache,
                    use_cache=True)
        return cache

    def step(cache, tok, pos):
        return patched(input_ids=tok, position_ids=pos.view(1, 1), past_key_values=cache, use_cache=True).logits[:, -1]

    eager_cache, graph_cache = prefilled(), prefilled()
    with torch.no_grad():
        want = [step(eager_cache, forced[:, k:k + 1], torch.tensor([6 + k], device="cuda")).float() for k in range(4)]
        # Step 0 runs eagerly on the graph's cache (the warm-up); steps 1..3 are replays.
        static_tok, static_pos = forced[:, :1].clone(), torch.tensor([6], device="cuda")
        first = step(graph_cache, static_tok, static_pos).float()
        static_tok.copy_(forced[:, 1:2])
        static_pos.fill_(7)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_logits = step(graph_cache, static_tok, static_pos)
        got = [first]
        for k in range(1, 4):
            static_tok.copy_(forced[:, k:k + 1])
            static_pos.fill_(6 + k)
            graph.replay()
            got.append(static_logits.float().clone())
    torch.cuda.synchronize()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-2 * w.abs().max().item())


@pytest.mark.gpu
@pytest.mark.compile
@gpu
def test_compiled_static_cache_decode_with_cuda_graphs(rng):
    """torch.compile(mode="reduce-overhead") of the patched decode step (CUDA graphs) gives the
    eager patched model's tokens (fp32, so no near-tie flips)."""
    torch._dynamo.reset()
    _, patched = pair("llama", rng)
    patched.cuda()
    ids = tokens(rng, batch=2, length=5, device="cuda")
    want, want_logits = static_decode(patched, ids, 6)
    got, got_logits = static_decode(patched, ids, 6, dict(mode="reduce-overhead", fullgraph=True, dynamic=False))
    torch._dynamo.reset()
    assert torch.equal(got, want)
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-3, atol=1e-3 * want_logits.abs().max().item())
