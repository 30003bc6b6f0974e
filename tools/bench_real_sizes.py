#!/usr/bin/env python
"""The PyTorch draft-target engine at real model sizes: where a round's time goes, and peak memory vs weights.

Random-weight models with the published shapes (config.json values) of a real pair, created from the config
(nothing is downloaded), saved as safetensors and loaded through trtspec's own loader (``--build disk``, the
default: the measured path is the one users run) or built on the device directly (``--build memory``: faster,
for big pairs on a GPU; the same KV-model class wraps the HF model). Pairs (``--pair``):

  qwen2.5     target Qwen2.5-1.5B shapes, draft Qwen2.5-0.5B (both tie embeddings)
  qwen2.5-3b  target Qwen2.5-3B shapes,   draft Qwen2.5-0.5B
  llama3      target Llama-3.1-8B,        draft Llama-3.2-1B (ties embeddings; llama3 rope scaling)
  demo           the shipped demo pair itself (trained weights, real prompts: the acceptance the demo has)
  demo-othertok  the demo target with the shipped draft that has its own tokenizer (trained, real prompts)

A demo pair is loaded from the package as it ships, so the options that make or shape the random models
(``--target-vocab``, ``--build``, ``--checkpoint-dtype``, ``--weights``, ``--models-dir``, ``--max-layers``) and
``--prompt-len`` (its prompts are tools/bench_engine's texts) are refused with it.

The Qwen pairs default to a padded-vocabulary target (``--target-vocab 152064``, the row count of Qwen2.5-7B
and larger; the 1.5B and 3B checkpoints themselves have the draft's 151936): same tokenizer, 128 extra rows.

For each K (0 = target-only) in one run, interleaved over ``--repeats``, it times ``engine.generate`` and splits
the wall time into the draft's forwards, the target's forwards (the two models' ``forward`` calls, wrapped with
timers; CUDA is synchronised around them), sampling/acceptance (every trtspec.engines.sampling function the
round calls), translation (a draft with its own tokenizer: the text both ways, core/translate.py) and bookkeeping
(the rest: building inputs, syncs, commit, stop checks). Then peak memory (CPU:
peak RSS of this process; CUDA: torch's max_memory_allocated) against the two models' weight bytes, with the
KV cache counted apart.

``--weights random`` (default) gives unrelated models (acceptance ~0: the round's cost with nothing accepted);
``--weights echo`` zeroes every layer's output projections, so both models predict "repeat the last token" and
every draft token is accepted (the same work per forward; the best case for speculation).

    .venv/bin/python tools/bench_real_sizes.py                        # CPU, fp32, Qwen2.5 1.5B / 0.5B
    .venv/bin/python tools/bench_real_sizes.py --pair llama3 --device cuda --dtype bfloat16 --build memory
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import resource
import sys
import tempfile
import threading
import time
import types
from dataclasses import dataclass
from pathlib import Path

import torch
from cli_common import cpu_name, run_main

# Published config.json values (huggingface.co/<repo>/blob/main/config.json). head_dim is derived unless given.
SHAPES = {
    "qwen2.5-0.5b": dict(
        model_type="qwen2",
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=32768,
        max_window_layers=24,
        sliding_window=32768,
        use_sliding_window=False,
    ),
    "qwen2.5-1.5b": dict(
        model_type="qwen2",
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=131072,
        max_window_layers=28,
        sliding_window=131072,
        use_sliding_window=False,
    ),
    "qwen2.5-3b": dict(
        model_type="qwen2",
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=32768,
        max_window_layers=36,
        sliding_window=32768,
        use_sliding_window=False,
    ),
    "llama-3.2-1b": dict(
        model_type="llama",
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        tie_word_embeddings=True,
        rope_theta=500000.0,
        rope_scaling=dict(
            rope_type="llama3",
            factor=32.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
        rms_norm_eps=1e-5,
        max_position_embeddings=131072,
    ),
    "llama-3.1-8b": dict(
        model_type="llama",
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        tie_word_embeddings=False,
        rope_theta=500000.0,
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
        rms_norm_eps=1e-5,
        max_position_embeddings=131072,
    ),
}
# pair -> (target shape, draft shape, default target vocab)
PAIRS = {
    "qwen2.5": ("qwen2.5-1.5b", "qwen2.5-0.5b", 152064),
    "qwen2.5-3b": ("qwen2.5-3b", "qwen2.5-0.5b", 152064),
    "llama3": ("llama-3.1-8b", "llama-3.2-1b", None),
    # the shipped, trained demo pair, on tools/bench_engine's prompts
    "demo": ("demo:target", "demo:draft", None),
    # the demo target with the shipped draft that has a tokenizer of its own (its tokens reach the target as text)
    "demo-othertok": ("demo:target", "demo:draft-othertok", None),
}
DEMO_PAIRS = ("demo", "demo-othertok")  # trained weights from the package, real prompts
# What a demo pair ignores: the options that make the random models, and the random prompts' length.
DEMO_IGNORES = (
    "target_vocab",
    "build",
    "checkpoint_dtype",
    "weights",
    "models_dir",
    "max_layers",
    "prompt_len",
)
CLASSES = {"qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "llama": ("LlamaConfig", "LlamaForCausalLM")}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
GIB = 1024**3


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def make_config(shape: str, vocab_size: int | None, max_layers: int | None = None):
    """The transformers config of a SHAPES entry (vocab_size None = the published one; max_layers cuts depth)."""
    import transformers

    values = dict(SHAPES[shape])
    config_cls = getattr(transformers, CLASSES[values.pop("model_type")][0])
    if vocab_size:
        values["vocab_size"] = vocab_size
    if max_layers:
        values["num_hidden_layers"] = min(values["num_hidden_layers"], max_layers)
    return config_cls(hidden_act="silu", **values)


def build_model(config, dtype: torch.dtype, device: str, weights: str, seed: int):
    """A random-weight HF causal LM made on ``device`` without a default init pass (meta, then filled once)."""
    import transformers

    model_cls = getattr(transformers, CLASSES[config.model_type][1])
    with torch.device("meta"):
        model = model_cls(config).to(dtype)
    model = model.to_empty(device=device)
    model.tie_weights()  # to_empty gives every parameter its own storage; tied embeddings must be one tensor
    # Non-persistent buffers (the rotary inv_freq) are not parameters: build them for real.
    with torch.device(device):  # transformers 4 takes a device argument here, 5 does not
        model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    fill_(model, weights, seed)
    return model.eval()


@torch.no_grad()
def fill_(model, weights: str, seed: int) -> None:
    """Norms 1, everything else N(0, 0.02) (the configs' initializer_range). ``echo``: zero output projections,
    so the residual stream is the token's embedding and the (tied or copied) lm_head predicts the same token."""
    generator = torch.Generator(model.device).manual_seed(seed)
    for name, param in model.named_parameters():  # a tied tensor is listed once
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        elif weights == "echo" and name.endswith(("o_proj.weight", "down_proj.weight")):
            param.zero_()
        else:
            param.normal_(0.0, 0.02, generator=generator)
    if weights == "echo" and not model.config.tie_word_embeddings:
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)


def write_checkpoint(out_dir: Path, config, dtype: str, weights: str, seed: int):
    """Save a random model as safetensors (run in a child process so its memory is not this process's peak)."""
    model = build_model(config, DTYPES[dtype], "cpu", weights, seed)
    model.save_pretrained(out_dir, safe_serialization=True, max_shard_size="2GB")
    (out_dir / "complete").touch()


def checkpoint(root: Path, shape: str, config, dtype: str, weights: str, seed: int) -> Path:
    """The checkpoint directory for these settings, written (in a child process) unless already complete."""
    layers = config.num_hidden_layers
    cut = "" if layers == SHAPES[shape]["num_hidden_layers"] else f"-l{layers}"
    out_dir = root / f"{shape}{cut}-v{config.vocab_size}-{dtype}-{weights}-s{seed}"
    if (out_dir / "complete").is_file():
        log(f"  reusing {out_dir}")
        return out_dir
    log(f"  writing {out_dir} ...")
    began = time.perf_counter()
    child = multiprocessing.get_context("spawn").Process(
        target=write_checkpoint, args=(out_dir, config, dtype, weights, seed)
    )
    child.start()
    child.join()
    if child.exitcode != 0:
        raise SystemExit(f"writing {out_dir} failed (exit code {child.exitcode})")
    log(f"  written in {time.perf_counter() - began:.0f} s")
    return out_dir


def weight_bytes(kv_model) -> int:
    """Bytes of the HF model's parameters, each storage once (a tied embedding counts once)."""
    storages = {
        p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in kv_model.hf_model.parameters()
    }
    return sum(storages.values())


def cache_bytes(kv_model) -> int:
    caches = [getattr(kv_model, name, None) for name in ("k_cache", "v_cache")]
    return sum(c.numel() * c.element_size() for c in caches if c is not None)


def rss_bytes() -> dict[str, int]:
    """This process's resident memory now: total, anonymous and file-backed (mmap'd checkpoint pages) bytes."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {key: int(fields[key].split()[0]) * 1024 for key in ("VmRSS", "RssAnon", "RssFile")}


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class RssMeter:
    """Peak resident memory per phase, sampled by a thread every ``interval`` s (ru_maxrss has one lifetime peak;
    the phases tell the loader's transient from the engine's own). Keeps the sample at each phase's peak."""

    def __init__(self, interval: float = 0.005):
        self.interval, self.phase, self.peaks = interval, "before", {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.stop.is_set():
            now = rss_bytes()
            peak = self.peaks.get(self.phase)
            if peak is None or now["VmRSS"] > peak["VmRSS"]:
                self.peaks[self.phase] = now
            time.sleep(self.interval)

    def __enter__(self) -> RssMeter:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def load_engine(args, target_shape: str, draft_shape: str, target_vocab: int | None, root: Path | None):
    """(engine, seconds): through SpeculativeEngine.from_pretrained (disk) or built on the device (memory)."""
    from trtspec.engines.engine import SpeculativeEngine
    from trtspec.engines.models import LeanCausalLM

    opts = dict(max_draft_len=max(args.ks), max_seq_len=args.max_seq_len)
    if args.pair in DEMO_PAIRS:
        from trtspec.recipe import DEMO_DIR

        began = time.perf_counter()
        draft = DEMO_DIR / draft_shape.removeprefix("demo:")
        engine = SpeculativeEngine.from_pretrained(
            DEMO_DIR / "target", draft, device=args.device, dtype=args.dtype,
            max_batch_size=args.batch, heterogeneous_vocab=args.pair == "demo-othertok", **opts,
        )  # fmt: skip
        return engine, time.perf_counter() - began
    seeds = {"target": 1, "draft": 2}
    configs = {
        "target": make_config(target_shape, target_vocab, args.max_layers),
        "draft": make_config(draft_shape, None, args.max_layers),
    }
    began = time.perf_counter()
    if args.build == "disk":
        dirs = {
            role: checkpoint(root, shape, configs[role], args.checkpoint_dtype, args.weights, seeds[role])
            for role, shape in (("target", target_shape), ("draft", draft_shape))
        }
        log("  loading through SpeculativeEngine.from_pretrained ...")
        began = time.perf_counter()
        engine = SpeculativeEngine.from_pretrained(
            dirs["target"],
            dirs["draft"],
            device=args.device,
            dtype=args.dtype,
            max_batch_size=args.batch,
            **opts,
        )
        return engine, time.perf_counter() - began
    models = {}
    for role, shape in (("target", target_shape), ("draft", draft_shape)):
        log(f"  building {role} ({shape}) on {args.device} ...")
        hf = build_model(configs[role], DTYPES[args.dtype], args.device, args.weights, seeds[role])
        kv = LeanCausalLM(hf, num_slots=args.batch, max_seq_len=args.max_seq_len)
        kv.config, kv.generation_config, kv.hf_model = hf.config, hf.generation_config, hf
        models[role] = kv
    return SpeculativeEngine(models["target"], models["draft"], **opts), time.perf_counter() - began


class Split:
    """Seconds spent in the two models' forwards and in sampling while the engine runs (see the docstring)."""

    PARTS = ("draft", "target", "sampling", "translate")

    def __init__(self, engine, device: str):
        self.sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        self.seconds = dict.fromkeys(self.PARTS, 0.0)
        self.calls = dict.fromkeys(self.PARTS, 0)
        self.engine = engine
        self.patched: list[tuple[object, str, object]] = []

    def timed(self, fn, part: str):
        def wrapper(*args, **kwargs):
            self.sync()  # pending work belongs to whatever queued it
            began = time.perf_counter()
            out = fn(*args, **kwargs)
            self.sync()
            self.seconds[part] += time.perf_counter() - began
            self.calls[part] += 1
            return out

        return wrapper

    def __enter__(self) -> Split:
        from trtspec.engines import sampling, speculative

        targets = [(self.engine.target, "forward", "target"), (self.engine.draft, "forward", "draft")]
        translator = getattr(
            self.engine, "translator", None
        )  # a draft with its own tokenizer: text both ways
        if translator is not None:
            targets += [(translator, "to_draft", "translate"), (translator, "to_target", "translate")]
        # Every sampling function the round module imported (robust to which ones it uses).
        targets += [
            (speculative, name, "sampling")
            for name, obj in vars(speculative).items()
            if isinstance(obj, types.FunctionType) and obj.__module__ == sampling.__name__
        ]
        for owner, name, part in targets:
            original = getattr(owner, name)
            self.patched.append((owner, name, owner.__dict__.get(name)))
            setattr(owner, name, self.timed(original, part))
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, original in reversed(self.patched):
            if original is None:
                delattr(owner, name)  # an instance attribute shadowing the method
            else:
                setattr(owner, name, original)
        self.patched.clear()


@dataclass
class Run:
    """One engine.generate at one K: wall seconds, tokens, the split and the draft tokens accepted/drafted."""

    k: int
    seconds: float
    tokens: int
    parts: dict[str, float]
    calls: dict[str, int]
    accepted: int
    drafted: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def rounds(self) -> int:
        return self.calls["target"]  # one target forward per round, K = 0 included

    @property
    def bookkeeping(self) -> float:
        return self.seconds - sum(self.parts.values())


def generate_once(
    engine, prompts: list[list[int]], k: int, max_new: int, device: str, temperature: float
) -> Run:
    from trtspec.engines.sampling import SamplingParams

    params = SamplingParams(
        max_new_tokens=max_new, num_draft_tokens=k, ignore_eos=True, temperature=temperature, seed=0
    )
    with Split(engine, device) as split:
        split.sync()
        began = time.perf_counter()
        results = engine.generate(prompts, params)
        split.sync()
        seconds = time.perf_counter() - began
    tokens = sum(len(r.token_ids) for r in results)
    accepted, drafted = (sum(getattr(r.stats, name) for r in results) for name in ("accepted", "drafted"))
    return Run(k, seconds, tokens, split.seconds, split.calls, accepted, drafted)


def print_table(runs: dict[int, Run]) -> None:
    base = runs.get(0)
    print(
        f"{'K':>2} {'tok/s':>7} {'vs K=0':>6} {'accept':>6} {'tok/rnd':>7} {'ms/rnd':>7} | {'draft':>6} "
        f"{'target':>6} {'sampl.':>6} {'bookk.':>6} | {'draft':>5} {'target':>6} {'sampl.':>6} {'bookk.':>6} "
        f"{'non-fwd':>7} {'transl.':>7}"
    )
    print(f"{'':43} | {'ms per round':^27} | {'fraction of the round':^42}")
    for k, run in runs.items():
        rounds = run.rounds
        ms = {p: run.parts[p] / rounds * 1e3 for p in Split.PARTS}
        frac = {p: run.parts[p] / run.seconds for p in Split.PARTS}
        other = (run.parts["sampling"] + run.parts["translate"] + run.bookkeeping) / run.seconds
        speedup = f"{run.tokens_per_s / base.tokens_per_s:5.2f}x" if base else "   - "
        accept = f"{run.accepted / run.drafted:6.1%}" if run.drafted else "     -"
        print(
            f"{k:2d} {run.tokens_per_s:7.2f} {speedup:>6} {accept} {run.tokens / rounds:7.2f} "
            f"{run.seconds / rounds * 1e3:7.1f} | {ms['draft']:6.1f} {ms['target']:6.1f} {ms['sampling']:6.2f} "
            f"{run.bookkeeping / rounds * 1e3:6.2f} | {frac['draft']:5.1%} {frac['target']:6.1%} "
            f"{frac['sampling']:6.2%} {run.bookkeeping / run.seconds:6.2%} {other:7.2%} {frac['translate']:7.2%}"
        )


def print_bounds(runs: dict[int, Run]) -> None:
    """Where the gap to the analytic bound goes. In units of K=0's round (one target step + its bookkeeping):
    c = one draft step (the draft's forwards per round / K, catch-up included), v = the (K+1)-token verification
    (the target's forwards per round), o = the rest of the round beyond K=0's. The analytic bound (core.metrics,
    what bench reports) is tokens per round / (1 + K c): a verification as cheap as one step, no extra rest; the
    measured round is v + K c + o, so achieved = tokens per round / (v + K c + o)."""
    from trtspec.core.metrics import analytic_speedup_bound

    base = runs.get(0)
    if base is None:
        return
    unit = base.seconds / base.rounds
    print(
        f"{'K':>2} {'c':>5} {'v':>5} {'o':>5} | {'bound':>6} {'speedup':>7} {'of bound':>8} | {'bound at v':>10}"
    )
    for k, run in runs.items():
        if k == 0:
            continue
        per_round = {p: run.parts[p] / run.rounds / unit for p in Split.PARTS}
        c, v = per_round["draft"] / k, per_round["target"]
        o = run.seconds / run.rounds / unit - v - k * c
        tokens = run.tokens / run.rounds
        bound, speedup = analytic_speedup_bound(tokens, k, c), run.tokens_per_s / base.tokens_per_s
        print(
            f"{k:2d} {c:5.3f} {v:5.2f} {o:5.2f} | {bound:6.2f} {speedup:6.2f}x {speedup / bound:8.1%} | "
            f"{analytic_speedup_bound(tokens, k, c, v):10.2f}"
        )
    print("(bound at v: the bound with the measured verification; the rest, o, is all that separates it)\n")


def median_runs(all_runs: dict[int, list[Run]]) -> dict[int, Run]:
    """Per K, the run with the median tokens/s (its own split, so the parts add up)."""
    chosen = {}
    for k, runs in all_runs.items():
        ordered = sorted(runs, key=lambda r: r.tokens_per_s)
        chosen[k] = ordered[(len(ordered) - 1) // 2]
    return chosen


def memory_report(engine, device: str, meter: RssMeter, before: int) -> None:
    """Weights, KV cache and peak memory per phase against the weights (the goal: <= 1.15x without the cache)."""
    weights = {role: weight_bytes(getattr(engine, role)) for role in ("target", "draft")}
    caches = {role: cache_bytes(getattr(engine, role)) for role in ("target", "draft")}
    total_w, total_c = sum(weights.values()), sum(caches.values())
    print(
        f"weights: target {weights['target'] / GIB:.3f} GiB + draft {weights['draft'] / GIB:.3f} GiB = "
        f"{total_w / GIB:.3f} GiB; KV cache {total_c / GIB:.3f} GiB (target {caches['target'] / 2**20:.0f} MiB, "
        f"draft {caches['draft'] / 2**20:.0f} MiB)"
    )
    if device.startswith("cuda"):
        peak = torch.cuda.max_memory_allocated()
        print(
            f"CUDA max_memory_allocated {peak / GIB:.3f} GiB = {peak / total_w:.3f}x weights; without the KV "
            f"cache {(peak - total_c) / GIB:.3f} GiB = {(peak - total_c) / total_w:.3f}x weights "
            f"(goal <= 1.15x); host peak RSS {peak_rss_bytes() / GIB:.2f} GiB"
        )
        return
    print(
        f"CPU resident memory, {before / GIB:.2f} GiB before loading (Python, torch, transformers) subtracted; "
        "file = mmap'd checkpoint pages (clean, reclaimable, but resident):"
    )
    print(f"  {'phase':40} {'peak RSS':>8} {'anon':>6} {'file':>6} {'- KV':>6} {'x weights':>9}")
    for phase, peak in meter.peaks.items():
        kv = 0 if "from_pretrained" in phase else total_c  # the cache exists once the KV model does
        grown = peak["VmRSS"] - before - kv
        if phase == "before" or grown < 0.01 * total_w:
            continue  # nothing resident was added (e.g. checkpoints written by a child process)
        print(
            f"  {phase:40} {peak['VmRSS'] / GIB:8.2f} {peak['RssAnon'] / GIB:6.2f} {peak['RssFile'] / GIB:6.2f} "
            f"{grown / GIB:6.2f} {grown / total_w:9.3f}"
        )
    lifetime = peak_rss_bytes() - before - total_c
    print(
        f"  {'lifetime peak (ru_maxrss)':40} {peak_rss_bytes() / GIB:8.2f} {'':13} {lifetime / GIB:6.2f} "
        f"{lifetime / total_w:9.3f}"
    )
    print("  (goal: x weights <= 1.15 in every phase)")


@contextlib.contextmanager
def load_phases(meter: RssMeter):
    """Name the meter's phases around the loader's HF load (transformers' from_pretrained), then the KV model."""
    from trtspec.engines import models

    original = getattr(models, "load_hf_model", None)  # the name load_causal_lm calls
    if original is None:
        yield
        return

    def load_hf_model(model_dir, *args, **kwargs):
        name = Path(model_dir).name.split("-v")[0]
        meter.phase = f"load {name}: from_pretrained"
        model = original(model_dir, *args, **kwargs)
        meter.phase = f"load {name}: KV model"
        return model

    models.load_hf_model = load_hf_model
    try:
        yield
    finally:
        models.load_hf_model = original


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", choices=PAIRS, default="qwen2.5")
    parser.add_argument("--target-vocab", type=int, default=None, help="target rows (default: the pair's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--build", choices=["disk", "memory"], default="disk")
    parser.add_argument(
        "--checkpoint-dtype",
        choices=DTYPES,
        default="bfloat16",
        help="dtype of the saved checkpoint (disk): bfloat16 as published; --dtype is what the engine runs in",
    )
    parser.add_argument("--weights", choices=["random", "echo"], default="random")
    parser.add_argument("--models-dir", type=Path, default=None, help="keep/reuse checkpoints here (disk)")
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 2, 4])
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; > 0 = rejection sampling")
    parser.add_argument("--max-seq-len", type=int, default=1024, help="KV cache positions per slot")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument(
        "--max-layers", type=int, default=None, help="cut depth (a quick check, not real sizes)"
    )
    args = parser.parse_args(argv)
    ignored = [name for name in DEMO_IGNORES if getattr(args, name) != parser.get_default(name)]
    if args.pair in DEMO_PAIRS and ignored:
        options = ", ".join("--" + name.replace("_", "-") for name in ignored)
        parser.error(f"--pair {args.pair} is a shipped pair run on real prompts; it takes no {options}")
    return args


def load_engine_metered(args, meter: RssMeter, target_vocab: int | None):
    """load_engine with the meter's phases named; checkpoints live in a temporary directory unless kept."""
    target_shape, draft_shape, _ = PAIRS[args.pair]
    with tempfile.TemporaryDirectory(prefix="bench_real_sizes-") as tmp, load_phases(meter):
        root = args.models_dir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        log(f"[1/3] models: target {target_shape} (vocab {target_vocab or 'published'}), draft {draft_shape}")
        meter.phase = "build on the device" if args.build == "memory" else "write checkpoints"
        return load_engine(args, target_shape, draft_shape, target_vocab, root)


def batch_prompts(engine, args) -> list[list[int]]:
    """The batch's prompts: a demo pair's are tools/bench_engine's texts (the acceptance the demo has); the random
    models' are random ids of ``--prompt-len``."""
    if args.pair in DEMO_PAIRS:
        from bench_engine import PROMPTS

        return [engine.tokenizer(PROMPTS[b % len(PROMPTS)])["input_ids"] for b in range(args.batch)]
    vocab = min(engine.target.vocab_size, engine.draft.vocab_size)
    generator = torch.Generator().manual_seed(0)
    return [
        torch.randint(0, vocab, (args.prompt_len,), generator=generator).tolist() for _ in range(args.batch)
    ]


def run_all(engine, prompts: list[list[int]], args, load_s: float) -> dict[int, list[Run]]:
    """A warm-up per K, then ``repeats`` rounds over the Ks in turn (so drifting machine load hits all alike)."""
    log(f"[2/3] warm-up (loaded in {load_s:.0f} s)")
    for k in args.ks:  # long enough for the allocator and kernel choices to settle (GPU first runs are slow)
        generate_once(engine, prompts, k, min(args.max_new_tokens, 16), args.device, args.temperature)
    all_runs: dict[int, list[Run]] = {k: [] for k in args.ks}
    for repeat in range(args.repeats):
        for k in args.ks:
            run = generate_once(engine, prompts, k, args.max_new_tokens, args.device, args.temperature)
            all_runs[k].append(run)
            log(f"[3/3] repeat {repeat + 1}/{args.repeats} K={k}: {run.tokens_per_s:.2f} tokens/s")
    return all_runs


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target_shape, draft_shape, default_vocab = PAIRS[args.pair]
    target_vocab = args.target_vocab or default_vocab
    import transformers  # noqa: F401 - imported before the baseline RSS is taken

    import trtspec.engines.engine  # noqa: F401

    before = rss_bytes()["VmRSS"]
    sampling = f"temperature {args.temperature}" if args.temperature else "greedy"
    with RssMeter() as meter:
        engine, load_s = load_engine_metered(args, meter, target_vocab)
        meter.phase = "generate"
        prompts = batch_prompts(engine, args)
        all_runs = run_all(engine, prompts, args, load_s)
    made = "trained, from the package" if args.pair in DEMO_PAIRS else f"{args.weights}, build {args.build}"
    lengths = "/".join(str(n) for n in sorted({len(p) for p in prompts}))
    print(
        f"\npair {args.pair}: target {target_shape} vocab {engine.target.vocab_size}, draft {draft_shape} vocab "
        f"{engine.draft.vocab_size}; {args.device} {args.dtype}, {cpu_name()}, threads {torch.get_num_threads()}, "
        f"weights {made}; batch {args.batch}, prompt {lengths} tokens + "
        f"{args.max_new_tokens} new tokens, {sampling}, max_seq_len {args.max_seq_len}; median of {args.repeats} "
        "(tokens/s of every repeat: "
        + ", ".join(
            f"K={k}: " + "/".join(f"{r.tokens_per_s:.2f}" for r in runs) for k, runs in all_runs.items()
        )
        + ")\n"
    )
    print_table(median_runs(all_runs))
    print(
        "(non-fwd = sampling + translation + bookkeeping: everything but the two models' forwards; goal <= 5%,"
        " <= 10% with a draft of another tokenizer)\n"
    )
    print_bounds(median_runs(all_runs))
    memory_report(engine, args.device, meter, before)


if __name__ == "__main__":
    run_main(main)
