"""The ``trtspec`` command line: one Click group, thin commands (options -> spec -> one call -> views).

Heavy libraries (torch, transformers, modelopt, tritonclient) are imported inside the commands so that
``trtspec --help`` starts instantly. Every option can also come from a ``TRTSPEC_<COMMAND>_<PARAMETER>``
environment variable (its exact name is shown in ``--help``); the recipe argument reads ``TRTSPEC_RECIPE``.
What a command returns is shown by trtspec/views.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import inspect
import io
import math
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from trtspec import __version__
from trtspec.core import layout
from trtspec.core.errors import TrtspecError
from trtspec.core.interrupts import raise_if_interrupted, record_interrupts
from trtspec.core.lookup import PROPOSERS
from trtspec.core.metrics import MAX_DRAFT_COST_RATIO
from trtspec.core.model_dir import out_of_memory
from trtspec.validate.bench import LOADS
from trtspec.validate.inputs import SystemOptions
from trtspec.validate.validation import Thresholds


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


def options(*decorators: Callable) -> Callable:
    """One decorator applying Click ``decorators`` so they appear in --help in the order given."""

    def apply(func):
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return apply


def spec_group(argument: str, spec_type: type, *decorators: Callable) -> Callable:
    """``decorators`` (Click options named like ``spec_type``'s fields, and like no other parameter of the
    command) whose values reach the command as one ``spec_type`` built by keyword, in its parameter ``argument``."""
    names = {f.name for f in dataclasses.fields(spec_type)}

    def decorate(func):
        @functools.wraps(func)
        def command(*args, **kwargs):
            values = {name: kwargs.pop(name) for name in names & kwargs.keys()}
            return func(*args, **{argument: spec_type(**values)}, **kwargs)

        return options(*decorators)(command)

    return decorate


RECIPE_HELP = "RECIPE is a builders/<pair>.yaml file; 'demo' (the default) is the shipped demo pair."


def with_recipe_help(func):
    """End the help of a command that takes RECIPE with RECIPE_HELP, the one place that says what RECIPE is."""
    func.__doc__ = f"{inspect.cleandoc(func.__doc__ or '')}\n\n{RECIPE_HELP}"
    return func


def _recipe_path(ctx, param, value: str) -> str:
    """~ expanded once, here, so that every use of the path (loading it, refusing to write over it) sees one."""
    from trtspec.recipe import resolve_recipe_path

    return value if value == "demo" else str(resolve_recipe_path(value))


def recipe_argument(func):
    """The RECIPE argument (also read from TRTSPEC_RECIPE), explained at the end of the command's help."""
    argument = click.argument(
        "recipe", envvar="TRTSPEC_RECIPE", default="demo", metavar="[RECIPE]", callback=_recipe_path
    )
    return argument(with_recipe_help(func))


class Finite(click.FloatRange):
    """click.FloatRange that also refuses nan and inf (nan passes every bound comparison, so a threshold of nan
    would pass every run)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def out_dir_option(help: str, file_okay: bool = False):
    """--out: where a command writes (its parameter and TRTSPEC_<COMMAND>_OUT_DIR say out_dir)."""
    return click.option("--out", "out_dir", type=click.Path(file_okay=file_okay, path_type=Path), help=help)


def force_option(what: str):
    """--force: replace files a user edited or added in an earlier output folder (outputs.check_output_dir)."""
    return click.option(
        "--force",
        is_flag=True,
        help=f"Replace {what} even where files in it were edited or added since it was written.",
    )


def file_out_option(flag: str, help: str):
    """An optional file the command writes, checked to be writable before the command's work starts."""
    return click.option(flag, type=click.Path(dir_okay=False, path_type=Path), help=help)


@click.group(
    context_settings={
        "auto_envvar_prefix": "TRTSPEC",
        "show_default": True,
        "help_option_names": ["-h", "--help"],
    }
)
@click.version_option(__version__, prog_name="trtspec")
@with_recipe_help
def cli() -> None:
    """trtspec: a target and a draft Hugging Face model to a served draft-target speculative-decoding deployment.

    \b
    Main job:  trtspec check RECIPE -> build RECIPE -> deploy RECIPE -> serve triton_repo/<name>
    Proof:     trtspec validate RECIPE, trtspec bench RECIPE
    Tuning:    trtspec align RECIPE --prompts FILE (distil the draft toward the target)
    """


# One --runtime for check, build and deploy: the same effective triton.runtime for all three steps.
runtime_option = click.option(
    "--runtime",
    type=click.Choice(["tensorrtllm", "torch", "trtllm-pytorch"]),
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
    type=Finite(min=0, min_open=True),
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
    """Pre-flight checks of a draft/target pair, no GPU needed. Exit 0 pass, 1 a check failed, 2 bad input."""
    from trtspec.builders.preflight import run_checks
    from trtspec.recipe import load_recipe
    from trtspec.views import show_check

    spec = load_recipe(
        recipe,
        {"speculative.allow_unsupported_precision": allow_unsupported_precision, "triton.runtime": runtime},
    )
    report = run_checks(spec, gpu_memory_gib=gpu_memory)
    show_check(report, out)
    if not report.ok:
        sys.exit(1)


# --- convert / quantize ---

FORMAT_CHOICES = click.Choice(["none", "fp8", "int8_sq", "int4_awq", "w4a8_awq"])


def role_option(verb: str):
    return click.option(
        "--model",
        "model",
        type=click.Choice(["target", "draft", "both"]),
        default="both",
        help=f"Which model of the pair to {verb}.",
    )


checkpoint_out_option = out_dir_option(
    "Checkpoint dir (default engines/<name>/<role>/checkpoint; with both models, <out>/<role>)."
)
no_verify_option = click.option(
    "--no-verify", is_flag=True, help="Skip the interpreter check of the written checkpoint against HF."
)


def _export_checkpoints(spec, out: Output) -> None:
    """convert and quantize: one builders.convert.ExportSpec -> the checkpoints, shown."""
    from trtspec.builders.convert import export_checkpoints
    from trtspec.views import show_checkpoints

    show_checkpoints(export_checkpoints(spec, console=out.console()), out)


@cli.command()
@recipe_argument
@role_option("convert")
@checkpoint_out_option
@click.option("--dtype", type=click.Choice(["float16", "bfloat16"]), help="Override the recipe's dtype.")
@click.option(
    "--tp-size",
    type=click.IntRange(1, 64),
    help="Tensor-parallel ranks (one rank{N}.safetensors each).",
)
@click.option("--pp-size", type=click.IntRange(1, 64), help="Pipeline-parallel stages.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), help="Where the HF model is loaded.")
@no_verify_option
@output_options
def convert(recipe, model, out_dir, dtype, tp_size, pp_size, device, no_verify, out: Output) -> None:
    """HF -> TensorRT-LLM checkpoint (fp16/bf16) via ModelOpt, verified against the HF model."""
    from trtspec.builders.convert import ExportSpec

    # unquantized, so with the KV cache in the model's dtype (an fp8 cache needs a quantization: trtspec quantize)
    per_role = {
        "quantization": "none",
        "kv_cache_dtype": "auto",
        "dtype": dtype,
        "tp_size": tp_size,
        "pp_size": pp_size,
    }
    shared = {"calibration.device": device}
    _export_checkpoints(ExportSpec(recipe, model, shared, per_role, out=out_dir, verify=not no_verify), out)


def _calib_data(ctx, param, value: str | None) -> str | None:
    """A file named on the command line is the current folder's, not the recipe's (where the recipe's own
    calibration.dataset resolves); the recipe checks what is in it."""
    if value is None or value == "builtin":
        return value
    path = Path(value).expanduser().absolute()
    if not path.is_file():
        raise click.BadParameter(f"{value}: no such file; give 'builtin' or a .txt / .jsonl file")
    return str(path)


@cli.command()
@recipe_argument
@role_option("quantize")
@click.option("--target-format", type=FORMAT_CHOICES, help="Override target.quantization.")
@click.option("--draft-format", type=FORMAT_CHOICES, help="Override draft.quantization.")
@click.option(
    "--kv-cache-dtype",
    type=click.Choice(["auto", "fp8"]),
    help="KV cache dtype of the quantized models.",
)
@click.option(
    "--calib-data",
    type=click.Path(dir_okay=False),
    callback=_calib_data,
    help="'builtin' or a .txt / .jsonl file (one {\"text\": ...} per line).",
)
@click.option("--calib-size", type=click.IntRange(1), help="Number of calibration samples.")
@click.option("--calib-seq-len", type=click.IntRange(8), help="Tokens per calibration sample.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), help="Where calibration runs.")
@checkpoint_out_option
@no_verify_option
@output_options
def quantize(
    recipe, model, target_format, draft_format, kv_cache_dtype, calib_data, calib_size, calib_seq_len, device, out_dir,
    no_verify, out: Output,
) -> None:  # fmt: skip
    """fp8 / int8 SmoothQuant / int4 AWQ / w4a8 AWQ checkpoints via ModelOpt post-training quantization."""
    from trtspec.builders.convert import ExportSpec

    shared = {
        "target.quantization": target_format,
        "draft.quantization": draft_format,
        "calibration.dataset": calib_data,
        "calibration.size": calib_size,
        "calibration.seq_len": calib_seq_len,
        "calibration.device": device,
    }
    per_role = {"kv_cache_dtype": kv_cache_dtype}
    spec = ExportSpec(recipe, model, shared, per_role, out=out_dir, verify=not no_verify, quantize=True)
    _export_checkpoints(spec, out)


# --- build ---


@cli.command()
@recipe_argument
@runtime_option
@click.option(
    "--engines-dir",
    type=click.Path(file_okay=False, path_type=Path),
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
    recipe: str, runtime: str | None, engines_dir: Path, engines_only: bool, force: bool, out: Output
) -> None:
    """check -> convert/quantize -> TensorRT-LLM engines for both models, skipping up-to-date stages.

    Without tensorrt_llm it stops after the checkpoints and the plan, writes engines/<name>/finish_in_ngc.sh and
    exits 3. With triton.runtime trtllm-pytorch it builds no engines: it checks the pair and writes each quantized
    model's ModelOpt HF checkpoint to engines/<name>/<role>/hf_checkpoint.
    """
    from trtspec.builders.build import build as run_build
    from trtspec.core.errors import NeedsTensorRTLLM
    from trtspec.recipe import load_recipe
    from trtspec.views import show_build

    spec = load_recipe(recipe, {"triton.runtime": runtime}, check_paths=not engines_only)
    try:
        result = run_build(spec, engines_dir, engines_only=engines_only, force=force, console=out.console())
    except NeedsTensorRTLLM as err:
        if out.json and err.manifest:
            out.emit_json(err.manifest)  # what was done (status needs_tensorrt_llm), then exit 3
        raise
    show_build(result, out)


# --- generate ---


def _utf8(ctx, param, value):
    """A command-line text as UTF-8: the shell passes bytes, and one that is not UTF-8 reaches Python as a lone
    surrogate, which a tokenizer refuses with a TypeError."""
    for text in value if isinstance(value, tuple) else (value,):
        if text is None:
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise click.BadParameter(
                f"not UTF-8 text (a stray byte at character {err.start}); pass UTF-8"
            ) from None
    return value


@cli.command()
@click.option(
    "--prompt", required=True, callback=_utf8, help="Text to continue (with --chat: the user's message)."
)
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
    "--target",
    type=click.Path(path_type=Path),
    help="Target HF model directory (instead of --recipe).",
)
@click.option("--draft", type=click.Path(path_type=Path), help="Draft HF model directory (with --target).")
@click.option("--no-draft", is_flag=True, help="Target-only decoding (the baseline).")
@click.option(
    "--proposer",
    type=click.Choice(PROPOSERS),
    help="Who proposes the draft tokens: the draft model, prompt lookup (ngram: no draft model needed) or per "
    "round whichever pays more [default: the recipe's speculative.proposer, else draft].",
)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=128)
@click.option(
    "--num-draft-tokens",
    type=click.IntRange(min=0),
    help="Draft tokens per round K [default: the recipe's speculative.num_draft_tokens, else adaptive].",
)
@click.option(
    "--max-draft-len",
    type=click.IntRange(min=1),
    help="Engine limit [default: the recipe's, or 8].",
)
@click.option("--temperature", type=Finite(min=0), default=0.0, help="0 = greedy.")
@click.option("--top-k", type=click.IntRange(min=0), default=0, help="0 = off.")
@click.option("--top-p", type=Finite(0, 1, min_open=True), default=1.0)
@click.option("--seed", type=click.IntRange(0, 2**64 - 1))
@click.option(
    "--stop",
    multiple=True,
    callback=_utf8,
    help="Stop string (repeatable; in the environment variable, stop strings are separated by whitespace, so one "
    "that holds a space needs the option).",
)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu")
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16", "float16"]),
    help="[default: float32 on cpu, the recipe's dtype on cuda]",
)
@output_options
def generate(out: Output, **options) -> None:
    """Speculative generation with the PyTorch engine: streams the text as tokens are accepted, then the stats."""
    from trtspec.engines.generate import GenerateSpec, run_generate
    from trtspec.views import show_generated, streams_text, write_text

    generated = run_generate(GenerateSpec(**options), on_text=write_text if streams_text(out) else None)
    show_generated(generated, out)


# --- deploy / serve ---


@cli.command()
@recipe_argument
@runtime_option
@out_dir_option("Repository folder [default: triton_repo/<name>].", file_okay=True)
@click.option(
    "--engines-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=str(layout.ENGINES_DIR),
    help="Where `trtspec build` put engines/<name>/{target,draft}/engine (tensorrtllm runtime) and "
    "quantized models' hf_checkpoint (trtllm-pytorch runtime).",
)
@click.option(
    "--k8s",
    "k8s_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Instead of the repository, write a Kubernetes rollout for the recipe to DIR: a kustomize base and "
    "overlays/{production,canary,gate} (and build, where a build Job runs) for `kubectl apply -k` "
    "(docs/kubernetes.md).",
)
@force_option("an earlier repository or rollout")
@output_options
def deploy(
    recipe: str,
    runtime: str | None,
    out_dir: Path | None,
    engines_dir: Path,
    k8s_dir: Path | None,
    force: bool,
    out: Output,
) -> None:
    """Write a Triton model repository: the entry point tensorrt_llm_bls, also served as upstream's `ensemble`
    (torch: the draft and the target in-process, batched in flight; tensorrtllm: the speculative orchestrator over
    the target and draft engine models), rendered strictly and checked with Triton's schema.
    """
    from trtspec.recipe import load_recipe
    from trtspec.triton_repo.deploy import deploy as write_repo
    from trtspec.views import show_deploy, show_rollout

    if k8s_dir is not None:
        if out_dir is not None:
            raise click.UsageError("--out names a repository folder; with --k8s the rollout goes to DIR")
        from trtspec.triton_repo.k8s import write_rollout

        # The models live in the cluster (a volume or the image), not necessarily on this machine.
        show_rollout(
            write_rollout(load_recipe(recipe, check_paths=False), runtime, k8s_dir, force=force), out
        )
        return
    show_deploy(write_repo(load_recipe(recipe), runtime, out_dir, engines_dir=engines_dir, force=force), out)


def _port_option(kind: str):
    """--<kind>-port of serve, range-checked like the recipe's triton.<kind>_port."""
    return click.option(
        f"--{kind}-port",
        type=click.IntRange(1, 65535),
        help=f"[default: the recipe's triton.{kind}_port]",
    )


def _host(ctx, param, value: str | None) -> str | None:
    """--host checked as the recipe's triton.host is (an empty one is not 'the default')."""
    from trtspec.recipe import host_problem

    if value is not None and (problem := host_problem(value)):
        raise click.BadParameter(problem)
    return value


@cli.command()
@click.argument("repo", type=click.Path(path_type=Path))
@click.option(
    "--host", callback=_host, help="Address to bind [default: the recipe's triton.host, 127.0.0.1]."
)
@_port_option("http")
@_port_option("grpc")
@_port_option("metrics")
@click.option(
    "--timeout",
    "timeout_s",
    type=Finite(min=0, min_open=True),
    help="Seconds to wait for every model to load [default: 300, or 3600 under MPI (TensorRT-LLM engines)].",
)
@click.option(
    "--exit-timeout",
    "exit_timeout_s",
    type=click.IntRange(min=0),
    help="Seconds requests in flight may still run once the server is asked to stop (tritonserver's "
    "--exit-timeout-secs); a pod's terminationGracePeriodSeconds must cover it [default: 15].",
)
@output_options
def serve(out: Output, **options) -> None:
    """Run tritonserver (the NGC image's, else nvidia-pytriton's) on REPO until Ctrl-C. With --json, the endpoints
    are one JSON document on stdout once every model is ready (the rest goes to stderr)."""
    from trtspec.triton_repo.serve import ServeSpec
    from trtspec.triton_repo.serve import serve as run_server
    from trtspec.views import print_line

    console = out.console()
    status = run_server(
        ServeSpec(
            **{name: value for name, value in options.items() if value is not None}
        ),  # unset: its default
        echo=lambda text: print_line(console, text),
        on_ready=out.emit_json if out.json else None,
    )
    sys.exit(status)


# --- validate / bench: the same request and system options, each command's own in between ---


def request_options(max_tokens: int) -> Callable:
    """RECIPE, the prompt set and the new tokens per prompt (RunOptions' fields)."""
    return options(
        recipe_argument,
        click.option(
            "--prompts",
            type=click.Path(dir_okay=False, path_type=Path),
            help='Prompt JSONL ({"prompt": ...} or {"messages": [...]} per line), or a shipped set: raw, chat, '
            "grounded or grounded-chat (answers that repeat the prompt) [default: raw, then chat where the target "
            "has a chat template, then the grounded sets where a proposer looks up].",
        ),
        click.option("--limit", type=click.IntRange(min=1), help="Use only the first N prompts."),
        click.option(
            "--chat",
            is_flag=True,
            help="Render plain prompts as single user messages with the target tokenizer's chat template "
            '("messages" lines always are).',
        ),
        click.option(
            "--max-tokens", type=click.IntRange(min=1), default=max_tokens, help="New tokens per prompt."
        ),
    )


def _endpoint(ctx, param, value: str | None) -> str | None:
    """--url checked before any work (validate.triton_client.split_url's rule)."""
    if value is None:
        return None
    from trtspec.validate.triton_client import split_url

    try:
        split_url(value)
    except TrtspecError as err:
        raise click.BadParameter(err.message) from None
    return value


system_options = spec_group(
    "system",
    SystemOptions,
    click.option(
        "--system",
        type=click.Choice(["auto", "engine", "triton", "trtllm"]),
        default="auto",
        help="System under test; auto = triton when --url is given, else the in-process engine.",
    ),
    click.option("--url", callback=_endpoint, help="Triton endpoint HOST:PORT (gRPC) or http://HOST:PORT."),
    click.option(
        "--protocol",
        type=click.Choice(["auto", "grpc", "http"]),
        default="auto",
        help="Triton protocol; auto = http for http:// URLs, else grpc.",
    ),
    click.option(
        "--model",
        "triton_model",
        help="Triton entry model [default: tensorrt_llm_bls, else upstream's LLM-API tensorrt_llm].",
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
)


def _threshold_option(name: str, default: float | None, what: str):
    return click.option(
        f"--{name}", type=Finite(0, 1), default=default, help=f"Fail (exit 1) below this {what}."
    )


@cli.command()
@request_options(max_tokens=32)
@click.option(
    "--num-draft-tokens",
    type=click.IntRange(min=1),
    help="Draft tokens per round (K) [default: the recipe's speculative.num_draft_tokens, else adaptive K; "
    "against a server, its own default: the K its entry model pins, else adaptive K (the recipe's where the "
    "server does not say)].",
)
@click.option(
    "--proposer",
    type=click.Choice(PROPOSERS),
    help="Who proposes the draft tokens (draft model, ngram: prompt lookup, draft+ngram) [default: the recipe's "
    "speculative.proposer; against a server, none is sent: its repository's]. With a proposer that looks up, the "
    "default prompts add the shipped grounded set.",
)
@spec_group(
    "thresholds",
    Thresholds,
    _threshold_option("min-exact-match", None, "exact-match rate vs the HF reference"),
    _threshold_option("min-acceptance", None, "acceptance rate"),
    _threshold_option(
        "min-control-match", 1.0, "exact-match rate of speculative vs target-only on the same system"
    ),
)
@file_out_option("--report", "Write a Markdown report here.")
@click.option(
    "--force", is_flag=True, help="Replace a --report file that is not an earlier trtspec validate report."
)
@system_options
@output_options
def validate(out: Output, **options) -> None:
    """Greedy outputs of the system under test vs the HF PyTorch reference and vs its own target-only decoding.
    Exit 0 pass, 1 a threshold failed, 2 bad input.
    """
    from trtspec.validate.run_validate import ValidateOptions, require_passed
    from trtspec.validate.run_validate import validate as run_validate
    from trtspec.views import show_validation, spinner

    with spinner(out) as on_progress:
        result = run_validate(ValidateOptions(**options), on_progress)
    show_validation(result, out)
    require_passed(result)


def _int_list(ctx, param, value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        values = tuple(int(v) for v in str(value).split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers, e.g. 1,2,4") from None
    if min(values) < 1:
        raise click.BadParameter(f"{value!r}: give integers >= 1, e.g. 1,2,4")
    return tuple(dict.fromkeys(values))  # a value given twice is one point, measured once


def _proposer_list(ctx, param, value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = tuple(dict.fromkeys(v.strip() for v in str(value).split(",")))
    bad = next((name for name in names if name not in PROPOSERS), None)
    if bad is not None:
        raise click.BadParameter(
            f"{bad or value!r} is not a proposer; give a comma-separated list of "
            f"{', '.join(PROPOSERS)}, e.g. draft,ngram"
        )
    return names


def _count_option(flag: str, help: str):
    """How many times bench measures each point: 1 or more, 1 by default."""
    return click.option(flag, type=click.IntRange(min=1), default=1, help=help)


@cli.command()
@request_options(max_tokens=64)
@click.option(
    "--num-draft-tokens",
    "ks",
    callback=_int_list,
    help="Static K values to sweep (comma-separated) [default: 1..max_draft_len]; target-only (K=0) and "
    "adaptive K (requests that give no K; against a server, where its entry model's default is adaptive) always "
    "run too.",
)
@click.option(
    "--concurrency",
    callback=_int_list,
    help="Concurrent requests to sweep (comma-separated) [default: 1,2,4,8,16, in-process up to the recipe's "
    "limits.max_batch_size].",
)
@click.option(
    "--proposer",
    "proposers",
    callback=_proposer_list,
    help=f"Proposers to sweep (comma-separated: {', '.join(PROPOSERS)}), each at every K and adaptive K, "
    "against one target-only baseline [default: the recipe's speculative.proposer; against a server, none is "
    "sent: its repository's]. With one that looks up, the default prompts add the shipped grounded set.",
)
@click.option(
    "--draft-cost-ratio",
    type=Finite(min=0, min_open=True, max=MAX_DRAFT_COST_RATIO),
    help="Draft step / target step time for the analytic bound [default: measured in-process].",
)
@out_dir_option("Folder for bench.json, bench.md and the plots [default: bench/<name>].")
@_count_option(
    "--repeats",
    "Passes over each concurrency's points, one after another (at least; see --min-groups); each point pools its "
    "passes (steadier ratios on a shared machine).",
)
@_count_option(
    "--min-groups",
    "At least this many groups of `concurrency` requests per point: more passes where one pass has fewer (16 "
    "prompts at concurrency 16 make one group, one timing sample).",
)
@click.option(
    "--load",
    type=click.Choice(LOADS),
    default="groups",
    show_default=True,
    help="groups: each group of `concurrency` requests issued together, the next when all are done; streams: a "
    "steady load of `concurrency` requests in flight, the next issued as one finishes, of 0.5x-1.5x --max-tokens "
    "(what a server meets from independent clients: no point runs its requests in lockstep).",
)
@file_out_option(
    "--write-recipe",
    "Write a copy of the recipe here with the recommended speculative.schedule (adaptive K by default).",
)
@force_option("an earlier report at --out")
@system_options
@output_options
def bench(out: Output, **options) -> None:
    """Sweep target-only, each static K and adaptive K (per proposer) over concurrency on the same system, side by
    side: tokens/s, TTFT, ITL, acceptance (per proposer and prompt set), the analytic bound, adaptive K against the
    best point, a recommended K and speculative.schedule; writes JSON, Markdown and PNG plots (and, with
    --write-recipe, a recipe copy).
    """
    from trtspec.validate.run_bench import BenchOptions
    from trtspec.validate.run_bench import bench as run_bench
    from trtspec.views import progress_bar, show_bench

    with progress_bar(out) as on_progress:
        outcome = run_bench(BenchOptions(**options), on_progress)
    show_bench(outcome, out)


# --- align ---


@cli.command()
@recipe_argument
@click.option(
    "--prompts",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    required=True,
    help='Your prompts: JSONL (.jsonl: {"prompt": ...} or {"messages": [...]} per line) or text, one per line.',
)
@out_dir_option("The aligned draft folder [default: align/<name>/draft].")
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Data and checkpoints; a re-run resumes from it [default: align/<name>/work].",
)
@click.option(
    "--budget",
    "budget_min",
    type=Finite(min=0, min_open=True),
    default=15.0,
    metavar="MINUTES",
    help="Wall time for data and training together (across resumed runs).",
)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", help="Where both models run.")
@click.option(
    "--held-out",
    type=Finite(0, 1, min_open=True, max_open=True),
    default=0.1,
    metavar="FRACTION",
    help="Share of the prompts (every 1/FRACTION-th) kept out of training for the report.",
)
@click.option(
    "--validation",
    type=Finite(0, 1, max_open=True),
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
@click.option("--lr", type=Finite(min=0, min_open=True), default=1e-4, help="AdamW learning rate.")
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
@force_option("an earlier aligned draft")
@output_options
def align(
    out: Output, out_dir, epochs, max_new_tokens, samples, no_on_policy, held_out, validation, **options
) -> None:
    """Distil the draft toward the target on your prompts: a new draft folder (the source is only read), a recipe
    copy pointing at it, and before/after acceptance on held-out prompts. Interrupted runs resume.
    """
    from trtspec.builders.align import AlignSpec, run_align
    from trtspec.builders.align_data import DataSpec
    from trtspec.views import show_align, stage_bars

    data = DataSpec(
        max_new_tokens=max_new_tokens,
        samples=samples,
        on_policy=not no_on_policy,
        held_out=held_out,
        validation=validation,
    )
    spec = AlignSpec(out=out_dir, max_epochs=epochs, data=data, **options)
    with stage_bars(out) as on_progress:
        result = run_align(spec, on_progress)
    show_align(result, out)


def _show_envvars(group: click.Group) -> None:
    """Every option of every command lists its TRTSPEC_<COMMAND>_<OPTION> variable in --help."""
    for command in group.commands.values():
        for param in command.params:
            if isinstance(param, click.Option) and param.name not in ("help", "version"):
                param.show_envvar = True


_show_envvars(cli)


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``trtspec`` and ``python -m trtspec``. Click runs outside its standalone mode so that every
    error is shown here, as one line."""
    record_interrupts()
    try:
        try:
            status = cli.main(args=argv, prog_name="trtspec", standalone_mode=False)
        finally:
            # a Ctrl-C a library swallowed ends the command as an interrupt, whatever it returned or raised
            raise_if_interrupted()
    except click.exceptions.NoArgsIsHelpError as err:  # ``trtspec`` alone: the help, as click shows it
        err.show()
        sys.exit(err.exit_code)
    except click.UsageError as err:
        # a bad option or argument: the error and where help is, not the usage block
        where = f"; see `{err.ctx.command_path} --help`" if err.ctx is not None else ""
        click.echo(f"Error: {err.format_message().rstrip('.')}{where}", err=True)
        sys.exit(err.exit_code)
    except click.ClickException as err:  # CliError: a command's own error
        err.show()
        sys.exit(err.exit_code)
    except TrtspecError as err:  # raised outside a command's body (the commands turn theirs into CliError)
        CliError(err).show()
        sys.exit(err.exit_code)
    except OSError as err:
        if err.errno == errno.EPIPE:  # the reader went away (`trtspec ... | head`): nothing more to say
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        # A path the system refused (permissions, a file where a folder is needed, a full disk): one line naming
        # it, not a traceback; the commands' own checks catch the errors they expect before any work is done.
        if err.filename is None:
            raise
        where = err.filename if err.filename2 is None else f"{err.filename} -> {err.filename2}"
        click.echo(f"Error: {where}: {err.strerror or err}; check the path and its permissions", err=True)
        sys.exit(2)
    except (click.Abort, KeyboardInterrupt):  # Ctrl-C (click turns it into Abort, a RuntimeError)
        click.echo("Interrupted.", err=True)
        sys.exit(130)
    except (RuntimeError, MemoryError) as err:
        # a pair or a batch too large for the GPU (or host) it runs on: one line, not a traceback
        too_large = out_of_memory(err)
        if too_large is None:
            raise
        CliError(too_large).show()
        sys.exit(too_large.exit_code)
    sys.exit(status if isinstance(status, int) else 0)  # --help and --version return 0; a command None


__all__ = ["cli", "main", "Output", "output_options", "recipe_argument"]
