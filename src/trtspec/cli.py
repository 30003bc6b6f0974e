"""The ``trtspec`` command line: one Click group, thin commands (options -> spec -> one call).

Heavy libraries (torch, transformers, modelopt, tritonclient) are imported inside the commands so that
``trtspec --help`` starts instantly. Every option can also come from a ``TRTSPEC_<COMMAND>_<PARAMETER>``
environment variable (its exact name is shown in ``--help``); the recipe argument reads ``TRTSPEC_RECIPE``.
"""

from __future__ import annotations

import contextlib
import functools
import io
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import click

from trtspec import __version__
from trtspec.core import layout
from trtspec.core.errors import TrtspecError


@dataclass
class Output:
    """How a command reports: rich text on the terminal, one JSON document on stdout, or (quiet) errors only."""

    json: bool = False
    verbose: bool = False
    quiet: bool = False

    stdout: Any = None  # the command's stdout, kept while other libraries' prints are redirected

    def console(self):
        from rich.console import Console

        # Human-readable output goes to stderr when --json owns stdout.
        return Console(stderr=self.json, quiet=self.quiet)

    def emit_json(self, payload) -> None:
        import json

        click.echo(json.dumps(payload, indent=2, sort_keys=False, default=str), file=self.stdout)

    @contextlib.contextmanager
    def own_stdout(self) -> Iterator[None]:
        """With --json, stdout carries one JSON document; with -q, nothing. What other libraries print there
        (ModelOpt's quantizer lines, transformers' notices) goes to stderr, or nowhere with -q."""
        self.stdout = sys.stdout
        if not (self.json or self.quiet):
            yield
            return
        with contextlib.redirect_stdout(sys.stderr if not self.quiet else io.StringIO()):
            yield


def output_options(func):
    """--json / -v / --quiet on every command; the command receives ``out: Output``."""

    @click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
    @click.option("-v", "--verbose", is_flag=True, help="Show details of errors and progress.")
    @click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors (and --json output).")
    @functools.wraps(func)
    def wrapper(*args, as_json: bool, verbose: bool, quiet: bool, **kwargs):
        out = Output(json=as_json, verbose=verbose, quiet=quiet)
        try:
            with out.own_stdout():
                return func(*args, out=out, **kwargs)
        except TrtspecError as err:
            raise CliError(err, verbose) from err

    return wrapper


class CliError(click.ClickException):
    """A domain error as Click shows it: ``Error: <message>`` on one line, the error's exit code, and its detail
    with -v. The domain errors stay free of Click; this is the one place they meet it."""

    def __init__(self, err: TrtspecError, verbose: bool = False):
        super().__init__(err.message)
        self.exit_code = err.exit_code
        self.detail = err.detail if verbose else None

    def show(self, file=None) -> None:
        super().show(file)
        if self.detail:
            click.echo(self.detail, err=True)


recipe_argument = click.argument("recipe", envvar="TRTSPEC_RECIPE", default="demo", metavar="RECIPE")
RECIPE_HELP = "RECIPE is a builders/<pair>.yaml file; 'demo' (the default) is the shipped demo pair."


@click.group(
    context_settings={
        "auto_envvar_prefix": "TRTSPEC",
        "show_default": True,
        "help_option_names": ["-h", "--help"],
    }
)
@click.version_option(__version__, prog_name="trtspec")
def cli() -> None:
    """trtspec: a target and a draft Hugging Face model to a served draft-target speculative-decoding deployment.

    \b
    Main job:  trtspec check RECIPE -> build RECIPE -> deploy RECIPE -> serve triton_repo/<name>
    Proof:     trtspec validate RECIPE, trtspec bench RECIPE
    Tuning:    trtspec align RECIPE --prompts FILE (distil the draft toward the target)
    RECIPE is a builders/<pair>.yaml file; 'demo' is the shipped demo pair.
    """


# One --runtime for check, build and deploy: the same effective triton.runtime for all three steps.
runtime_option = click.option(
    "--runtime",
    type=click.Choice(["tensorrtllm", "torch", "trtllm-pytorch"]),
    default=None,
    help="Engine models: the TensorRT-LLM C++ backend over 1.2.x engines, python models running the "
    "PyTorch engine (CPU), or upstream's LLM-API model on TensorRT-LLM's PyTorch backend (HF "
    "checkpoints). Default: the recipe's triton.runtime.",
)


@cli.command()
@recipe_argument
@runtime_option
@click.option(
    "--allow-unsupported-precision",
    is_flag=True,
    default=None,
    help="Accept precisions outside the draft-target support matrix.",
)
@click.option(
    "--gpu-memory",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="GIB",
    help="Fail when the per-GPU estimate exceeds this.",
)
@output_options
def check(
    recipe: str,
    runtime: str | None,
    allow_unsupported_precision: bool | None,
    gpu_memory: float | None,
    out: Output,
) -> None:
    """Pre-flight checks of a draft/target pair, no GPU needed. Exit 0 pass, 1 a check failed, 2 bad input.

    RECIPE is a builders/<pair>.yaml file; 'demo' (the default) is the shipped demo pair.
    """
    from trtspec.builders.check_report import print_check_report
    from trtspec.builders.preflight import run_checks
    from trtspec.recipe import load_recipe

    spec = load_recipe(
        recipe,
        {"speculative.allow_unsupported_precision": allow_unsupported_precision, "triton.runtime": runtime},
    )
    report = run_checks(spec, gpu_memory_gib=gpu_memory)
    print_check_report(report, out)
    if not report.ok:
        sys.exit(1)


# --- convert / quantize ---

ROLE_CHOICES = click.Choice(["target", "draft", "both"])
FORMAT_CHOICES = click.Choice(["none", "fp8", "int8_sq", "int4_awq", "w4a8_awq"])


def _roles(model: str) -> list[str]:
    return ["target", "draft"] if model == "both" else [model]


def _print_checkpoints(summaries: list, out: Output) -> None:
    if out.json:
        out.emit_json({"checkpoints": summaries})
        return
    console = out.console()
    for s in summaries:
        v = s["verification"]
        check = (
            "not verified"
            if v is None
            else f"verified: top-1 {v['top1_agreement']:.1%}, max abs logit error {v['max_abs_logit_error']:.3g}"
        )
        console.print(
            f"{s['role']}: {s['checkpoint']} ({s['format'] if s['format'] != 'none' else s['dtype']}, tp={s['tp_size']} pp={s['pp_size']}; {check})"
        )


@cli.command()
@recipe_argument
@click.option(
    "--model", "model", type=ROLE_CHOICES, default="both", help="Which model of the pair to convert."
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Checkpoint dir (default engines/<name>/<role>/checkpoint; with both models, <out>/<role>).",
)
@click.option(
    "--dtype", type=click.Choice(["float16", "bfloat16"]), default=None, help="Override the recipe's dtype."
)
@click.option(
    "--tp-size",
    type=click.IntRange(1, 64),
    default=None,
    help="Tensor-parallel ranks (one rank{N}.safetensors each).",
)
@click.option("--pp-size", type=click.IntRange(1, 64), default=None, help="Pipeline-parallel stages.")
@click.option(
    "--device", type=click.Choice(["cpu", "cuda"]), default=None, help="Where the HF model is loaded."
)
@click.option(
    "--no-verify", is_flag=True, help="Skip the interpreter check of the written checkpoint against HF."
)
@output_options
def convert(recipe, model, out_dir, dtype, tp_size, pp_size, device, no_verify, out: Output) -> None:
    """HF -> TensorRT-LLM checkpoint (fp16/bf16) via ModelOpt, verified against the HF model.

    RECIPE is a builders/<pair>.yaml file; 'demo' (the default) is the shipped demo pair.
    """
    from pathlib import Path

    from trtspec.builders.convert import export_models
    from trtspec.recipe import load_recipe

    roles = _roles(model)
    overrides = {"calibration.device": device}
    for role in roles:
        overrides.update(
            {
                f"{role}.quantization": "none",
                f"{role}.dtype": dtype,
                f"{role}.tp_size": tp_size,
                f"{role}.pp_size": pp_size,
            }
        )
    spec = load_recipe(recipe, overrides)
    summaries = export_models(
        spec, roles, out=Path(out_dir) if out_dir else None, verify=not no_verify, console=out.console()
    )
    _print_checkpoints(summaries, out)


@cli.command()
@recipe_argument
@click.option(
    "--model", "model", type=ROLE_CHOICES, default="both", help="Which model of the pair to quantize."
)
@click.option("--target-format", type=FORMAT_CHOICES, default=None, help="Override target.quantization.")
@click.option("--draft-format", type=FORMAT_CHOICES, default=None, help="Override draft.quantization.")
@click.option(
    "--kv-cache-dtype",
    type=click.Choice(["auto", "fp8"]),
    default=None,
    help="KV cache dtype of the quantized models.",
)
@click.option(
    "--calib-data",
    type=click.Path(dir_okay=False),
    default=None,
    help="'builtin' or a .txt / .jsonl file (one {\"text\": ...} per line).",
)
@click.option("--calib-size", type=click.IntRange(1), default=None, help="Number of calibration samples.")
@click.option("--calib-seq-len", type=click.IntRange(8), default=None, help="Tokens per calibration sample.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None, help="Where calibration runs.")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Checkpoint dir (default engines/<name>/<role>/checkpoint; with both models, <out>/<role>).",
)
@click.option(
    "--no-verify", is_flag=True, help="Skip the interpreter check of the written checkpoint against HF."
)
@output_options
def quantize(
    recipe, model, target_format, draft_format, kv_cache_dtype, calib_data, calib_size, calib_seq_len, device, out_dir,
    no_verify, out: Output,
) -> None:  # fmt: skip
    """fp8 / int8 SmoothQuant / int4 AWQ / w4a8 AWQ checkpoints via ModelOpt post-training quantization.

    RECIPE is a builders/<pair>.yaml file; 'demo' (the default) is the shipped demo pair.
    """
    from pathlib import Path

    from trtspec.builders.convert import export_models
    from trtspec.recipe import load_recipe

    roles = _roles(model)
    overrides = {
        "target.quantization": target_format,
        "draft.quantization": draft_format,
        "calibration.dataset": calib_data,
        "calibration.size": calib_size,
        "calibration.seq_len": calib_seq_len,
        "calibration.device": device,
    }
    for role in roles:
        overrides[f"{role}.kv_cache_dtype"] = kv_cache_dtype
    spec = load_recipe(recipe, overrides)
    summaries = export_models(
        spec, roles, out=Path(out_dir) if out_dir else None, verify=not no_verify, console=out.console()
    )
    _print_checkpoints(summaries, out)


# --- build ---


@cli.command()
@recipe_argument
@runtime_option
@click.option(
    "--engines-dir",
    type=click.Path(file_okay=False),
    default=str(layout.ENGINES_DIR),
    help="Where engines/<name>/{target,draft}/{checkpoint,engine} and manifest.json go.",
)
@click.option(
    "--engines-only",
    is_flag=True,
    help="Only build engines from existing checkpoints (inside the NGC image; HF models not needed).",
)
@click.option("--force", is_flag=True, help="Re-run every stage even when its outputs are up to date.")
@output_options
def build(
    recipe: str, runtime: str | None, engines_dir: str, engines_only: bool, force: bool, out: Output
) -> None:
    """check -> convert/quantize -> TensorRT-LLM engines for both models, skipping up-to-date stages.

    RECIPE is a builders/<pair>.yaml file; 'demo' (the default) is the shipped demo pair. Without tensorrt_llm
    it stops after the checkpoints and the plan, writes engines/<name>/finish_in_ngc.sh and exits 3.
    With triton.runtime trtllm-pytorch it builds no engines: it checks the pair and writes each quantized
    model's ModelOpt HF checkpoint to engines/<name>/<role>/hf_checkpoint.
    """
    from pathlib import Path

    from trtspec.builders.build import build as run_build
    from trtspec.core.errors import NeedsTensorRTLLM
    from trtspec.recipe import load_recipe

    spec = load_recipe(recipe, {"triton.runtime": runtime}, check_paths=not engines_only)
    try:
        result = run_build(
            spec, Path(engines_dir), engines_only=engines_only, force=force, console=out.console()
        )
    except NeedsTensorRTLLM as err:
        if out.json and err.manifest:
            out.emit_json(err.manifest)  # what was done (status needs_tensorrt_llm), then exit 3
        raise
    if out.json:
        out.emit_json(result.manifest)
    else:
        what = "Checkpoints" if result.plan is None else "Engines"  # trtllm-pytorch serves HF checkpoints
        out.console().print(f"{what} ready in {result.out_dir} (ran: {', '.join(result.ran) or 'nothing'}).")


# --- generate ---


@cli.command()
@click.option("--prompt", required=True, help="Text to continue (with --chat: the user's message).")
@click.option(
    "--chat",
    is_flag=True,
    help="Send the prompt as a single user message rendered with the target tokenizer's chat template.",
)
@click.option(
    "--recipe",
    default="demo",
    envvar="TRTSPEC_RECIPE",
    help="Recipe file, or 'demo' (the shipped pair); ignored with --target.",
)
@click.option(
    "--target", type=click.Path(), default=None, help="Target HF model directory (instead of --recipe)."
)
@click.option("--draft", type=click.Path(), default=None, help="Draft HF model directory (with --target).")
@click.option("--no-draft", is_flag=True, help="Target-only decoding (the baseline).")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=128)
@click.option(
    "--num-draft-tokens",
    type=click.IntRange(min=0),
    default=None,
    help="Draft tokens per round K [default: the recipe's speculative.num_draft_tokens, else adaptive].",
)
@click.option(
    "--max-draft-len",
    type=click.IntRange(min=1),
    default=None,
    help="Engine limit [default: the recipe's, or 8].",
)
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, help="0 = greedy.")
@click.option("--top-k", type=click.IntRange(min=0), default=0, help="0 = off.")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0)
@click.option("--seed", type=int, default=None)
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu")
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16", "float16"]),
    default=None,
    help="[default: float32 on cpu, the recipe's dtype on cuda]",
)
@output_options
def generate(
    prompt,
    chat,
    recipe,
    target,
    draft,
    no_draft,
    max_new_tokens,
    num_draft_tokens,
    max_draft_len,
    temperature,
    top_k,
    top_p,
    seed,
    stop,
    device,
    dtype,
    out: Output,
) -> None:
    """Speculative generation with the PyTorch engine: streams the text as tokens are accepted, then the stats."""
    from trtspec.engines.generate import GenerateSpec, run_generate

    run_generate(
        GenerateSpec(
            prompt,
            recipe,
            target,
            draft,
            no_draft,
            max_new_tokens,
            num_draft_tokens,
            temperature,
            top_k,
            top_p,
            seed,
            tuple(stop),
            device,
            dtype,
            max_draft_len,
            chat=chat,
        ),
        out,
    )


# --- deploy / serve ---


@cli.command()
@recipe_argument
@runtime_option
@click.option(
    "--out",
    "out_dir",
    type=click.Path(),
    default=None,
    help="Repository folder [default: triton_repo/<name>].",
)
@click.option(
    "--engines-dir",
    type=click.Path(file_okay=False),
    default=str(layout.ENGINES_DIR),
    help="Where `trtspec build` put engines/<name>/{target,draft}/engine (tensorrtllm runtime) and "
    "quantized models' hf_checkpoint (trtllm-pytorch runtime).",
)
@output_options
def deploy(recipe: str, runtime: str | None, out_dir: str | None, engines_dir: str, out: Output) -> None:
    """Write a Triton model repository: preprocessing, postprocessing and the entry point tensorrt_llm_bls (torch:
    the draft and the target in-process, batched in flight; tensorrtllm: the speculative orchestrator over the
    target and draft engine models), rendered strictly and checked with Triton's schema.

    RECIPE is a builders/<pair>.yaml file; 'demo' (the default) is the shipped demo pair.
    """
    from pathlib import Path

    from trtspec.recipe import load_recipe
    from trtspec.triton_repo.deploy import deploy as write_repo

    spec = load_recipe(recipe)
    result = write_repo(spec, runtime, Path(out_dir) if out_dir else None, engines_dir=Path(engines_dir))
    if out.json:
        out.emit_json({"repo": str(result.repo), **result.manifest})
    else:
        out.console().print(f"wrote {result.repo} ({result.runtime} runtime): {', '.join(result.models)}")
        out.console().print(f"serve it with: trtspec serve {result.repo}")


def _port_option(kind: str):
    """--<kind>-port of serve, range-checked like the recipe's triton.<kind>_port."""
    return click.option(
        f"--{kind}-port",
        type=click.IntRange(0, 65535),
        default=None,
        help=f"[default: the recipe's triton.{kind}_port]",
    )


@cli.command()
@click.argument("repo", type=click.Path())
@click.option("--host", default=None, help="Address to bind [default: 127.0.0.1].")
@_port_option("http")
@_port_option("grpc")
@_port_option("metrics")
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds to wait for every model to load [default: 300, or 3600 under MPI (TensorRT-LLM engines)].",
)
@output_options
def serve(repo: str, host, http_port, grpc_port, metrics_port, timeout_s: float, out: Output) -> None:
    """Run tritonserver (the NGC image's, else nvidia-pytriton's) on REPO until Ctrl-C."""
    from pathlib import Path

    from trtspec.triton_repo.serve import ServeSpec
    from trtspec.triton_repo.serve import serve as run_server

    spec = ServeSpec(Path(repo), host, http_port, grpc_port, metrics_port, timeout_s)
    sys.exit(run_server(spec, echo=out.console().print))


# --- validate / bench ---


def _system_options(func):
    """Which system validate/bench test: the in-process engine, a Triton endpoint, or TensorRT-LLM engines."""
    options = [
        click.option(
            "--system",
            type=click.Choice(["auto", "engine", "triton", "trtllm"]),
            default="auto",
            help="System under test; auto = triton when --url is given, else the in-process engine.",
        ),
        click.option("--url", default=None, help="Triton endpoint HOST:PORT (gRPC) or http://HOST:PORT."),
        click.option(
            "--protocol",
            type=click.Choice(["auto", "grpc", "http"]),
            default="auto",
            help="Triton protocol; auto = http for http:// URLs, else grpc.",
        ),
        click.option(
            "--model", "triton_model", default=None, help="Triton entry model [default: tensorrt_llm_bls]."
        ),
        click.option(
            "--device",
            type=click.Choice(["cpu", "cuda"]),
            default="cpu",
            help="Device of the in-process engine and the HF reference.",
        ),
        click.option(
            "--dtype",
            type=click.Choice(["auto", "float32", "float16", "bfloat16"]),
            default="auto",
            help="In-process dtype; auto = float32 on cpu, the recipe's dtype on cuda.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


CHAT_HELP = (
    'Render plain prompts as single user messages with the target tokenizer\'s chat template ("messages" '
    "lines always are)."
)


def _system_spec(system, url, protocol, triton_model, device, dtype):
    from trtspec.validate.commands import SystemOptions

    return SystemOptions(system, url, protocol, triton_model, device, dtype)


@cli.command()
@recipe_argument
@click.option(
    "--prompts",
    type=click.Path(dir_okay=False),
    default=None,
    help='Prompt JSONL ({"prompt": ...} or {"messages": [...]} per line) [default: the shipped code+prose '
    "set, then the chat set where the target has a chat template].",
)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Use only the first N prompts.")
@click.option("--chat", is_flag=True, help=CHAT_HELP)
@click.option("--max-tokens", type=click.IntRange(min=1), default=32, help="New tokens per prompt.")
@click.option(
    "--num-draft-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Draft tokens per round (K) [default: the recipe's speculative.num_draft_tokens, else adaptive K; "
    "against a server, none is sent: its repository's default, which deploy makes adaptive unless the recipe "
    "pins a K].",
)
@click.option(
    "--min-exact-match",
    type=click.FloatRange(0, 1),
    default=None,
    help="Fail (exit 1) below this exact-match rate vs the HF reference.",
)
@click.option(
    "--min-acceptance",
    type=click.FloatRange(0, 1),
    default=None,
    help="Fail (exit 1) below this acceptance rate.",
)
@click.option(
    "--min-control-match",
    type=click.FloatRange(0, 1),
    default=1.0,
    help="Fail (exit 1) below this exact-match rate of speculative vs target-only on the same system.",
)
@click.option("--report", type=click.Path(dir_okay=False), default=None, help="Write a Markdown report here.")
@_system_options
@output_options
def validate(
    recipe,
    prompts,
    limit,
    chat,
    max_tokens,
    num_draft_tokens,
    min_exact_match,
    min_acceptance,
    min_control_match,
    report,
    system,
    url,
    protocol,
    triton_model,
    device,
    dtype,
    out: Output,
) -> None:
    """Greedy outputs of the system under test vs the HF PyTorch reference and vs its own target-only decoding.
    Exit 0 pass, 1 a threshold failed, 2 bad input.

    RECIPE is a builders/<pair>.yaml file; 'demo' (the default) is the shipped demo pair.
    """
    from pathlib import Path

    from trtspec.validate.commands import ValidateOptions
    from trtspec.validate.commands import validate as run_validate
    from trtspec.validate.validation import Thresholds

    run_validate(
        ValidateOptions(
            recipe,
            Path(prompts) if prompts else None,
            limit,
            max_tokens,
            num_draft_tokens,
            Thresholds(min_exact_match, min_acceptance, min_control_match),
            Path(report) if report else None,
            _system_spec(system, url, protocol, triton_model, device, dtype),
            chat=chat,
        ),
        out,
    )


def _int_list(ctx, param, value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        values = tuple(int(v) for v in str(value).split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers, e.g. 1,2,4") from None
    if not values or min(values) < 1:
        raise click.BadParameter(f"{value!r}: give integers >= 1, e.g. 1,2,4")
    return values


@cli.command()
@recipe_argument
@click.option(
    "--prompts",
    type=click.Path(dir_okay=False),
    default=None,
    help="Prompt JSONL [default: the shipped code+prose set, then the chat set where the target has a chat "
    "template].",
)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Use only the first N prompts.")
@click.option("--chat", is_flag=True, help=CHAT_HELP)
@click.option("--max-tokens", type=click.IntRange(min=1), default=64, help="New tokens per request.")
@click.option(
    "--num-draft-tokens",
    "ks",
    default=None,
    callback=_int_list,
    help="Static K values to sweep (comma-separated) [default: 1..max_draft_len]; target-only (K=0) and "
    "adaptive K (requests that give no K; against a server, where its entry model's default is adaptive) always "
    "run too.",
)
@click.option(
    "--concurrency",
    default=None,
    callback=_int_list,
    help="Concurrent requests to sweep (comma-separated) [default: 1,2,4,8,16, in-process up to the recipe's "
    "limits.max_batch_size].",
)
@click.option(
    "--draft-cost-ratio",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Draft step / target step time for the analytic bound [default: measured in-process].",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Folder for bench.json, bench.md and the plots [default: bench/<name>].",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=1,
    help="Passes over each concurrency's points, one after another (at least; see --min-groups); each point "
    "pools its passes (steadier ratios on a shared machine).",
)
@click.option(
    "--min-groups",
    type=click.IntRange(min=1),
    default=1,
    help="At least this many groups of `concurrency` requests per point: more passes where one pass has fewer "
    "(16 prompts at concurrency 16 make one group, one timing sample).",
)
@click.option(
    "--write-recipe",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write a copy of the recipe here with the recommended speculative.schedule (adaptive K by default).",
)
@_system_options
@output_options
def bench(
    recipe,
    prompts,
    limit,
    chat,
    max_tokens,
    ks,
    concurrency,
    draft_cost_ratio,
    out_dir,
    repeats,
    min_groups,
    write_recipe,
    system,
    url,
    protocol,
    triton_model,
    device,
    dtype,
    out: Output,
) -> None:
    """Sweep target-only, each static K and adaptive K over concurrency on the same system, side by side: tokens/s,
    TTFT, ITL, acceptance, the analytic bound, adaptive K against the best point, a recommended K and
    speculative.schedule; writes JSON, Markdown and PNG plots (and, with --write-recipe, a recipe copy).

    RECIPE is a builders/<pair>.yaml file; 'demo' (the default) is the shipped demo pair.
    """
    from pathlib import Path

    from trtspec.validate.commands import BenchOptions
    from trtspec.validate.commands import bench as run_bench

    run_bench(
        BenchOptions(
            recipe,
            Path(prompts) if prompts else None,
            limit,
            max_tokens,
            ks,
            concurrency,
            draft_cost_ratio,
            Path(out_dir) if out_dir else None,
            _system_spec(system, url, protocol, triton_model, device, dtype),
            chat=chat,
            write_recipe=Path(write_recipe) if write_recipe else None,
            repeats=repeats,
            min_groups=min_groups,
        ),
        out,
    )


# --- align ---


@cli.command()
@recipe_argument
@click.option(
    "--prompts",
    type=click.Path(dir_okay=False, exists=True),
    required=True,
    help='Your prompts: JSONL (.jsonl: {"prompt": ...} or {"messages": [...]} per line) or text, one per line.',
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="The aligned draft folder [default: align/<name>/draft].",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Data and checkpoints; a re-run resumes from it [default: align/<name>/work].",
)
@click.option(
    "--budget",
    "budget_min",
    type=click.FloatRange(min=0, min_open=True),
    default=15.0,
    metavar="MINUTES",
    help="Wall time for data and training together (across resumed runs).",
)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", help="Where both models run.")
@click.option(
    "--held-out",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=0.1,
    metavar="FRACTION",
    help="Share of the prompts (every 1/FRACTION-th) kept out of training for the report.",
)
@click.option(
    "--validation",
    type=click.FloatRange(0, 1, max_open=True),
    default=0.1,
    metavar="FRACTION",
    help="Share of the other prompts kept out of training to pick the best step's weights (0: the last step's).",
)
@click.option(
    "--loss",
    type=click.Choice(["kl", "tv"]),
    default="kl",
    help="Forward KL(target || draft) or total variation, per token.",
)
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=1e-4, help="AdamW learning rate.")
@click.option(
    "--max-new-tokens", type=click.IntRange(min=2), default=64, help="Target tokens per continuation."
)
@click.option(
    "--samples",
    type=click.IntRange(min=0),
    default=1,
    help="Sampled target continuations per prompt (beside greedy).",
)
@click.option(
    "--no-on-policy", is_flag=True, help="Leave out the draft's own continuations scored by the target."
)
@click.option(
    "--epochs", type=click.IntRange(min=1), default=8, help="At most this many passes over the data."
)
@output_options
def align(
    recipe, prompts, out_dir, work_dir, budget_min, device, held_out, validation, loss, lr, max_new_tokens,
    samples, no_on_policy, epochs, out: Output,
) -> None:  # fmt: skip
    """Distil the draft toward the target on your prompts: a new draft folder (the source is only read), a recipe
    copy pointing at it, and before/after acceptance on held-out prompts. Interrupted runs resume.

    RECIPE is a builders/<pair>.yaml file; 'demo' (the default) is the shipped demo pair.
    """
    from pathlib import Path

    from trtspec.builders.align import AlignSpec, run_align
    from trtspec.builders.align_data import DataSpec
    from trtspec.builders.align_report import report_table, selection_line

    spec = AlignSpec(
        recipe,
        Path(prompts),
        Path(out_dir) if out_dir else None,
        Path(work_dir) if work_dir else None,
        budget_min,
        device,
        loss,
        lr,
        max_epochs=epochs,
        data=DataSpec(
            max_new_tokens=max_new_tokens,
            samples=samples,
            on_policy=not no_on_policy,
            held_out=held_out,
            validation=validation,
        ),
    )
    result = run_align(spec, console=None if out.quiet else out.console())
    if out.json:
        out.emit_json({"out": str(result.out), **result.record})
        return
    console = out.console()
    console.print(report_table(result.report))
    console.print(selection_line(result.report))
    console.print(f"wrote {result.out} (align.json, report.md, acceptance.png, recipe.yaml)")
    console.print(f"use it with: trtspec validate {result.out / 'recipe.yaml'}")


def _show_envvars(group: click.Group) -> None:
    """Every option of every command lists its TRTSPEC_<COMMAND>_<OPTION> variable in --help."""
    for command in group.commands.values():
        for param in command.params:
            if isinstance(param, click.Option) and param.name not in ("help", "version"):
                param.show_envvar = True


_show_envvars(cli)


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``trtspec`` and ``python -m trtspec``."""
    try:
        cli.main(args=argv, prog_name="trtspec", standalone_mode=True)
    except TrtspecError as err:  # raised outside a command's body (the commands turn theirs into CliError)
        CliError(err).show()
        sys.exit(err.exit_code)
    except OSError as err:  # click's standalone mode handles only a broken pipe
        # A path the system refused (permissions, a file where a folder is needed, a full disk): one line naming
        # it, not a traceback; the commands' own checks catch the errors they expect before any work is done.
        if err.filename is None:
            raise
        where = err.filename if err.filename2 is None else f"{err.filename} -> {err.filename2}"
        click.echo(f"Error: {where}: {err.strerror or err}; check the path and its permissions", err=True)
        sys.exit(2)
    except KeyboardInterrupt:  # pragma: no cover - interactive
        click.echo("Interrupted.", err=True)
        sys.exit(130)


__all__ = ["cli", "main", "Output", "output_options", "recipe_argument", "RECIPE_HELP", "TrtspecError"]
