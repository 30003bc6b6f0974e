"""What a validate or bench run opens before it measures: the requests, the system under test and the HF reference.

``RunOptions`` holds the options both commands share; ``ValidateOptions`` (run_validate.py) and ``BenchOptions``
(run_bench.py) add their own. The requests are encoded and checked against the recipe's limits first, so a prompt
that cannot fit fails before any model loads.
"""

from __future__ import annotations

from collections.abc import Collection
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from trtspec.core.errors import TrtspecError

SYSTEMS = ("auto", "engine", "triton", "trtllm")


@dataclass(kw_only=True)
class SystemOptions:
    """Which system is under test. system 'auto': Triton when a URL is given, else the in-process engine."""

    system: str = "auto"
    url: str | None = None
    protocol: str = "auto"  # grpc | http | auto (from the URL's port / scheme)
    triton_model: str | None = None  # Triton entry model; None = the repository's entry point
    device: str = "cpu"
    dtype: str = "auto"
    max_batch_size: int | None = None

    @property
    def kind(self) -> str:
        if self.system != "auto":
            return self.system
        return "triton" if self.url else "engine"

    def check(self, reference: bool = True) -> None:
        """Refuse, before any work, options the chosen system would ignore (``reference``: the run loads the HF
        reference in-process, which --device and --dtype place)."""
        kind = self.kind
        if kind == "triton":
            if not self.url:
                raise TrtspecError(
                    "--system triton needs --url HOST:PORT (the server's gRPC or HTTP address)"
                )
            in_process = [
                f for f, on in (("--device", self.device != "cpu"), ("--dtype", self.dtype != "auto")) if on
            ]
            if in_process and not reference:
                raise TrtspecError(
                    f"{in_process[0]} is for a system run in-process; with --url nothing runs here, so drop it"
                )
            return
        if self.url:
            raise TrtspecError(
                f"--url {self.url}: --system {kind} runs in-process and sends nothing; drop one"
            )
        ignored = [
            f for f, on in (("--protocol", self.protocol != "auto"), ("--model", self.triton_model)) if on
        ]
        if ignored:
            raise TrtspecError(f"{ignored[0]} is for a server under test; give --url HOST:PORT or drop it")


def check_num_draft_tokens(ks: Collection[int], recipe, system=None) -> None:
    """K within max_draft_len, before any work: a server's (``system``, a TritonSystem: the one it publishes, else
    the recipe's), else the recipe's (the limit of its engines and of the repository deploy writes)."""
    if system is not None:
        limit, whose = system.max_draft_len, system.max_draft_len_source
    else:
        limit, whose = recipe.speculative.max_draft_len, "the recipe's speculative.max_draft_len"
    too_big = [k for k in ks if k is not None and k > limit]
    if too_big:
        raise TrtspecError(f"--num-draft-tokens {too_big[0]} > {whose} {limit}; use K <= {limit}")


@dataclass(kw_only=True)
class RunOptions:
    """The options validate and bench share: the recipe, the prompt set and the system under test."""

    recipe: str = "demo"
    prompts: Path | None = None  # None: the shipped sets; also a shipped set's name (prompts.SHIPPED_SETS)
    limit: int | None = None
    chat: bool = False  # raw prompts as single user messages through the chat template
    max_tokens: int = 32
    system: SystemOptions = field(default_factory=SystemOptions)

    def inputs(self) -> dict[str, Path | str | None]:
        """The files the run reads, by the argument or option that names them: an output must not be one."""
        return {"RECIPE": self.recipe, "--prompts": self.prompts}


def open_system(recipe, options: SystemOptions, tokenizer=None, proposers: Collection[str] = ()):
    """The system under test named by ``options`` (tokenizer: the target's, for text-only endpoints; proposers:
    the ones the run's requests name, which the in-process engine loads what for)."""
    kind = options.kind
    if kind == "engine":
        from trtspec.validate.systems import EngineSystem

        return EngineSystem.from_recipe(
            recipe, options.device, options.dtype, options.max_batch_size, proposers
        )
    if kind == "triton":
        from trtspec.validate.systems import served_dtype
        from trtspec.validate.triton_system import TritonSystem

        system = TritonSystem(  # options.check() has run: there is a URL
            options.url,
            tokenizer,
            protocol=options.protocol,
            model=options.triton_model,
            # the recipe's, where the server does not publish its own
            max_draft_len=recipe.speculative.max_draft_len,
            proposer=recipe.speculative.proposer,
            decoupled=recipe.triton.decoupled,
            max_batch_size=options.max_batch_size or recipe.limits.max_batch_size,
            llmapi_max_draft_len=llmapi_max_draft_len(recipe),
        )
        system.dtype = system.dtype or served_dtype(recipe)  # as the recipe deploys it, where it does not say
        return system
    if kind == "trtllm":
        # Same API as SpeculativeEngine; raises NeedsTensorRTLLM (exit 3) outside the NGC image.
        from trtspec.engines.trtllm_runner import TrtllmSpeculativeRunner
        from trtspec.validate.systems import EngineSystem, served_dtype

        runner = TrtllmSpeculativeRunner.from_recipe(recipe, max_batch_size=options.max_batch_size)
        name = f"TensorRT-LLM engines (engines/{recipe.name})"
        return EngineSystem(runner, name=name, dtype=served_dtype(recipe, "tensorrtllm"))
    raise TrtspecError(f"--system {kind!r} is not one of {', '.join(SYSTEMS)}")


def check_proposers(recipe, options: SystemOptions, proposers: Collection[str]) -> None:
    """In-process, a proposer that uses the draft model needs the recipe to have one (a server knows its own)."""
    from trtspec.core.lookup import uses_draft

    needs_draft = next((p for p in proposers if uses_draft(p)), None)
    if recipe.draft is None and needs_draft and options.kind != "triton":
        raise TrtspecError(
            f"recipe {recipe.name}: no draft model, so --proposer {needs_draft} cannot run; use --proposer ngram "
            "or give the recipe a draft"
        )


def llmapi_max_draft_len(recipe) -> int | None:
    """The K a trtllm-pytorch deployment of ``recipe`` drafts every round (its model.yaml's max_draft_len); None
    when the recipe cannot be deployed there."""
    from trtspec.builders import support

    if support.llmapi_speculation_problem(recipe.speculative):
        return None
    return support.llmapi_speculation(recipe.speculative, recipe.limits.max_batch_size).max_draft_len


def open_reference(recipe, options: SystemOptions):
    from trtspec.validate.reference import HFReference
    from trtspec.validate.systems import runtime_dtype

    return HFReference.from_pretrained(
        recipe.target.model,
        device=options.device,
        dtype=runtime_dtype(recipe, options.device, options.dtype),
        trust_remote_code=recipe.target.trust_remote_code,
    )


def check_requests_fit(prompts, requests, max_tokens: int, limits) -> None:
    """Every prompt fits the recipe's limits with ``max_tokens`` new tokens, checked before any model runs."""
    for prompt, request in zip(prompts, requests, strict=True):
        n = len(request.token_ids)
        if problem := limits.prompt_problem(n):
            raise TrtspecError(f"prompt {prompt.id}: {problem}")
        if n + max_tokens > limits.max_seq_len:
            raise TrtspecError(
                f"prompt {prompt.id}: {n} tokens + --max-tokens {max_tokens} > the recipe's limits.max_seq_len "
                f"{limits.max_seq_len}; lower --max-tokens or raise limits.max_seq_len"
            )


def target_tokenizer(recipe):
    from trtspec.core.model_dir import load_tokenizer

    return load_tokenizer(recipe.target.model, recipe.target.trust_remote_code)


def load_requests(
    recipe,
    path: Path | None,
    limit: int | None,
    chat: bool,
    max_tokens: int,
    lookup: bool = False,
    tokenizer=None,
):
    """(prompts, target tokenizer, requests, notes): the prompt set encoded (chats through the target's chat
    template) and checked against the recipe's limits, before any model loads. ``lookup``: a proposer of the run
    looks up (core/lookup.py), so the default selection adds the shipped grounded set. ``tokenizer``: the
    target's, where the caller has loaded it already."""
    from trtspec.chat import has_chat_template
    from trtspec.validate.prompts import load_prompts
    from trtspec.validate.systems import encode_prompts

    tokenizer = target_tokenizer(recipe) if tokenizer is None else tokenizer
    # Base models have no chat template: the shipped chat set is left out for them; asked-for chats fail.
    chat_set = chat or has_chat_template(tokenizer)
    notes = []
    if path is None and not chat_set:
        notes.append(f"{recipe.target.model}: no chat template, so the shipped chat prompts were left out.")
    prompts = load_prompts(path, limit, chat=chat, chat_set=chat_set, grounded_set=lookup)
    if path is None and lookup:
        notes.append("A proposer of this run looks up (ngram), so the shipped grounded prompts ran too.")
    requests = encode_prompts(tokenizer, prompts)
    check_requests_fit(prompts, requests, max_tokens, recipe.limits)
    return prompts, tokenizer, requests, notes


def load_run_requests(recipe, options: RunOptions, lookup: bool = False, tokenizer=None):
    """``load_requests`` for the prompt options of a run (``lookup``: a proposer of the run looks up)."""
    return load_requests(
        recipe, options.prompts, options.limit, options.chat, options.max_tokens, lookup, tokenizer
    )


@contextmanager
def served_system(recipe, options: SystemOptions):
    """(system, target tokenizer) where the system is a server, else (None, None); the server's connections are
    closed on the way out. A server is opened before the run's K range and prompt selection are worked out: they
    follow the max_draft_len and proposer it publishes (TritonSystem), and an unreachable endpoint fails before
    anything loads."""
    if options.kind != "triton":
        yield None, None
        return
    tokenizer = target_tokenizer(recipe)
    served = open_system(recipe, options, tokenizer)
    try:
        yield served, tokenizer
    finally:
        served.close()
