"""Build recipes: one YAML file declares one draft/target deployment (``builders/<pair>.yaml``).

``load_recipe(path, overrides)`` is the only way in: it applies CLI overrides (dotted field paths) to the raw
YAML, validates it with pydantic (unknown keys, wrong types, out-of-range values, missing model directories are
refused with the file, the field path and the offending value) and resolves relative paths against the recipe's
folder. ``demo:target`` / ``demo:draft`` name the demo pair shipped inside the package. Every field and its
default is documented in ``builders/README.md``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from trtspec.core.errors import RecipeError
from trtspec.core.lookup import LookupSpec
from trtspec.core.metrics import MAX_DRAFT_COST_RATIO

DEMO_SCHEME = "demo:"
ASSETS_DIR = Path(__file__).parent / "assets"
DEMO_DIR = ASSETS_DIR / "demo"
DEMO_RECIPE = DEMO_DIR / "recipe.yaml"

Dtype = Literal["float16", "bfloat16", "float32"]
Quantization = Literal["none", "fp8", "int8_sq", "int4_awq", "w4a8_awq"]
KvCacheDtype = Literal["auto", "fp8"]
Runtime = Literal["torch", "tensorrtllm", "trtllm-pytorch"]
Device = Literal["cpu", "cuda"]
Port = Annotated[int, Field(ge=1, le=65535)]  # a TCP port a server listens on (the recipe's and a manifest's)


class _Strict(BaseModel):
    """No unknown keys, and no coercion: ``max_draft_len: true`` or ``decoupled: 1`` is an error, not 1 / True."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def resolve_model_path(value: str | Path, base_dir: Path) -> Path:
    """``demo:NAME`` -> the shipped demo model; relative paths -> against ``base_dir`` (the recipe's folder)."""
    text = str(value)
    if text.startswith(DEMO_SCHEME):
        return DEMO_DIR / text[len(DEMO_SCHEME) :]
    try:
        path = Path(text).expanduser()
    except RuntimeError:  # ~name of a user this machine lacks, or ~ without a home directory
        home = text.split("/")[0]
        said = "no home directory is set here" if home == "~" else "no such user here"
        raise ValueError(f"{home}: {said}; give the folder's full path") from None
    return path if path.is_absolute() else (base_dir / path).resolve()


class ModelSpec(_Strict):
    """One model of the pair (target or draft)."""

    # Before ``model``: its check reads this (pydantic validates fields in order). Excluded from dumps, so it is
    # no part of the recipe's digest: how a folder is fetched does not change what is built from it.
    fetch: str | None = Field(
        None, exclude=True, description="the command that writes a missing model folder, named in the error"
    )
    model: Path = Field(
        strict=False,  # a YAML string
        description="Hugging Face model directory (config.json, weights, tokenizer) or demo:NAME",
    )
    dtype: Dtype = "float16"
    quantization: Quantization = "none"
    kv_cache_dtype: KvCacheDtype = "auto"
    tp_size: int = Field(1, ge=1, le=64)
    pp_size: int = Field(1, ge=1, le=64)
    gpu_ids: tuple[int, ...] | None = Field(
        None, strict=False, description="GPUs this model runs on; default 0..tp*pp-1"
    )
    trust_remote_code: bool = False

    @field_validator("model", mode="before")
    @classmethod
    def _resolve(cls, value: Any, info: ValidationInfo) -> Path:
        base = Path((info.context or {}).get("base_dir", "."))
        if not isinstance(value, str | Path) or not str(value).strip():
            raise ValueError("give a Hugging Face checkpoint folder or demo:NAME")
        path = resolve_model_path(value, base)
        if (info.context or {}).get("check_paths", True) and not path.is_dir():
            fetch = info.data.get("fetch")
            hint = f"run `{fetch}`" if fetch else "point it at a Hugging Face checkpoint"
            if path.exists():
                raise ValueError(f"{path} is a file, not a model folder; {hint}")
            raise ValueError(f"model directory {path} does not exist; {hint}")
        return path

    @field_validator("gpu_ids")
    @classmethod
    def _gpus(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and (not value or min(value) < 0 or len(set(value)) != len(value)):
            raise ValueError("gpu_ids must be distinct non-negative integers")
        return value

    @model_validator(mode="after")
    def _gpu_count(self) -> ModelSpec:
        if self.gpu_ids is not None and len(self.gpu_ids) != self.world_size:
            raise ValueError(f"gpu_ids has {len(self.gpu_ids)} ids but tp_size*pp_size is {self.world_size}")
        return self

    @model_validator(mode="after")
    def _fp8_kv_cache(self) -> ModelSpec:
        # trtspec writes an fp8 KV cache as part of a ModelOpt quantization (its KV quantizers calibrated with the
        # weights'); without one the setting would be silently ignored by every build path.
        if self.kv_cache_dtype == "fp8" and self.quantization == "none":
            raise ValueError(
                "kv_cache_dtype fp8 needs a quantization (the KV cache is quantized with the weights); "
                "set kv_cache_dtype: auto or choose a quantization"
            )
        return self

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def devices(self) -> tuple[int, ...]:
        return self.gpu_ids if self.gpu_ids is not None else tuple(range(self.world_size))


class SpeculativeSpec(_Strict):
    max_draft_len: int = Field(4, ge=1, le=64, description="engine limit K: the most draft tokens per round")
    num_draft_tokens: int | None = Field(
        None, ge=1, description="default per-request K; unset: adaptive K up to max_draft_len"
    )
    schedule: dict[int, int] | None = Field(
        None, description="adaptive K's cap by load: in-flight sequences (up to) -> largest K, 0 = off"
    )
    draft_cost_ratio: float = Field(
        0.2,
        gt=0,
        le=MAX_DRAFT_COST_RATIO,
        description="adaptive K's cost of one draft step in target decoding steps",
    )
    use_draft_logits: bool = Field(
        False,
        description="TensorRT-LLM engines accept sampled drafts by draft/target probabilities, not token match "
        "(the PyTorch engine always does)",
    )
    proposer: Literal["draft", "ngram", "draft+ngram"] = Field(
        "draft",
        description="who proposes draft tokens: the draft model, prompt lookup (ngram), or per row and round "
        "whichever pays more (draft+ngram); a request may pin its own",
    )
    prompt_lookup_min: int = Field(
        2, ge=1, le=16, description="prompt lookup's shortest suffix n-gram (vLLM)"
    )
    prompt_lookup_max: int = Field(4, ge=1, le=16, description="prompt lookup's longest suffix n-gram (vLLM)")
    heterogeneous_vocab: bool = Field(
        False,
        description="allow a draft with another tokenizer: its tokens reach the target as text "
        "(core/translate.py); a pair sharing one tokenizer ignores it",
    )
    allow_unsupported_precision: bool = Field(
        False, description="build outside the draft-target support matrix"
    )

    @model_validator(mode="after")
    def _k(self) -> SpeculativeSpec:
        if self.num_draft_tokens is not None and self.num_draft_tokens > self.max_draft_len:
            raise ValueError(f"num_draft_tokens {self.num_draft_tokens} > max_draft_len {self.max_draft_len}")
        for in_flight, k in sorted((self.schedule or {}).items()):
            if in_flight < 1 or not 0 <= k <= self.max_draft_len:
                raise ValueError(
                    f"schedule {{{in_flight}: {k}}}: in-flight counts must be >= 1 and K in 0..max_draft_len "
                    f"{self.max_draft_len}"
                )
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"prompt_lookup_min {self.prompt_lookup_min} > prompt_lookup_max {self.prompt_lookup_max}"
            )
        ks = [k for _, k in sorted((self.schedule or {}).items())]
        if ks != sorted(ks, reverse=True):
            raise ValueError(f"schedule K must not grow with the in-flight count (got {self.schedule})")
        return self

    @property
    def lookup(self) -> LookupSpec:
        return LookupSpec(self.prompt_lookup_min, self.prompt_lookup_max)

    @property
    def default_num_draft_tokens(self) -> int:
        """The pinned K, else max_draft_len: the most a request without a K drafts (unpinned, adaptive K's cap)."""
        return self.num_draft_tokens or self.max_draft_len


class LimitsSpec(_Strict):
    max_batch_size: int = Field(8, ge=1, le=4096)
    max_input_len: int = Field(512, ge=1)
    max_seq_len: int = Field(1024, ge=2)

    def prompt_problem(self, tokens: int) -> str | None:
        """Why a prompt of ``tokens`` tokens cannot be served under these limits (None: it can), for every
        command that takes prompts to say alike."""
        if tokens > self.max_input_len:
            return (
                f"{tokens} tokens > the recipe's limits.max_input_len {self.max_input_len}; shorten it or raise "
                "limits.max_input_len"
            )
        return None


def _require_utf8(path: Path, what: str, prefix_bytes: int = 1 << 20) -> None:
    """ValueError now, before any model loads, if the file's start is not UTF-8 text (a binary file given by
    mistake); the readers decode the whole file as UTF-8 later."""
    import codecs

    with open(path, "rb") as f:
        head = f.read(prefix_bytes)
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) < prefix_bytes)
    except UnicodeDecodeError as err:
        raise ValueError(f"{what} {path} is not UTF-8 text (byte {err.start}); save it as UTF-8") from None


class CalibrationSpec(_Strict):
    dataset: str = Field("builtin", description="'builtin' (demo corpus) or a .txt / .jsonl file")
    size: int = Field(64, ge=1, description="number of calibration samples")
    seq_len: int = Field(256, ge=8, description="tokens per calibration sample")
    device: Device = "cpu"

    @field_validator("dataset", mode="before")
    @classmethod
    def _dataset(cls, value: Any, info: ValidationInfo) -> str:
        if str(value) == "builtin":
            return "builtin"
        path = resolve_model_path(value, Path((info.context or {}).get("base_dir", ".")))
        if (info.context or {}).get("check_paths", True):
            if not path.is_file():
                raise ValueError(
                    f"calibration file {path} does not exist; use 'builtin' or a .txt/.jsonl file"
                )
            _require_utf8(path, "calibration file")
        return str(path)


class PerModel(_Strict):
    target: float = Field(0.5, gt=0, lt=1)
    draft: float = Field(0.5, gt=0, lt=1)


class InstanceCounts(_Strict):
    orchestrator: int = Field(1, ge=1, le=64)


class TritonSpec(_Strict):
    runtime: Runtime = "torch"
    device: Device = Field(
        "cpu", description="device of the torch runtime (its entry model runs both models)"
    )
    torch_dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto", description="dtype of the torch runtime: auto = float32 on cpu, the model's dtype on cuda"
    )
    decoupled: bool = Field(True, description="stream accepted tokens as each round is verified")
    cpu_threads: Annotated[int, Field(ge=1, le=1024)] | Literal["auto"] = Field(
        "auto",
        description="torch intra-op threads of the torch runtime on cpu (one process runs the draft and the "
        "target one after the other); auto = every core the server may use; fewer pins the generation loop to "
        "that many cores and the response-sending thread to the rest",
    )
    draft_ahead: bool = Field(
        True,
        description="while the target verifies a round, draft the next one (used when the whole draft and the "
        "draft's guess of the bonus token are accepted); only while a single request is being served; the "
        "tensorrtllm runtime's orchestrator",
    )
    instances: InstanceCounts = InstanceCounts()
    kv_cache_free_gpu_mem_fraction: PerModel = PerModel()
    enable_kv_cache_reuse: bool = True
    fast_logits: bool = Field(False, description="speculative_decoding_fast_logits with participant ids")
    host: str = Field("127.0.0.1", description="address tritonserver binds: an IP address or a host name")
    http_port: Port = 8000
    grpc_port: Port = 8001
    metrics_port: Port = 8002

    @property
    def ports(self) -> dict[str, int]:
        """The endpoints' ports by name, in tritonserver's order: http, grpc, metrics."""
        return {"http": self.http_port, "grpc": self.grpc_port, "metrics": self.metrics_port}

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        if problem := host_problem(value):
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _distinct_ports(self) -> TritonSpec:
        if clash := repeated_port(self.ports):
            kind, earlier = clash
            raise ValueError(
                f"{kind}_port {self.ports[kind]} is also {earlier}_port; the server needs three distinct ports"
            )
        return self


def port_problem(port: object) -> str | None:
    """Why ``port`` is not a TCP port a server can listen on, by the recipe's own rule (``Port``; None: it is)."""
    try:
        TypeAdapter(Port).validate_python(port, strict=True)
    except ValidationError as err:
        return f"{err.errors()[0]['msg']} (got {port!r})"
    return None


# What an address or a host name the resolver may know is written with (/etc/hosts names with underscores; IPv6,
# refused by host_problem with its own reason); anything else can never be bound.
_HOST = re.compile(r"^[A-Za-z0-9._:%-]{1,253}$")


def host_problem(host: object) -> str | None:
    """Why ``host`` can never be an address to bind (None: it may be; whether this machine has it is the
    server's check). An IPv6 literal is refused: tritonserver 2.51's HTTP and metrics endpoints parse their
    address as IPv4 (``::1`` or ``[::1]`` binds 255.255.255.255, which no client reaches)."""
    if not isinstance(host, str) or not _HOST.match(host):
        return (
            f"not an IP address or a host name (got {host!r}); use one such as 127.0.0.1, or 0.0.0.0 for every "
            "interface"
        )
    if ":" in host:
        return (
            f"an IPv6 address (got {host!r}); tritonserver's HTTP and metrics endpoints bind IPv4 addresses only: "
            "use 127.0.0.1, or 0.0.0.0 for every interface"
        )
    return None


def repeated_port(ports: Mapping[str, int]) -> tuple[str, str] | None:
    """The first endpoint (http, grpc, metrics) whose port an earlier one has, and that one: tritonserver needs
    three distinct ports, whether a recipe or serve's options name them."""
    seen: dict[int, str] = {}
    for kind, port in ports.items():
        if port in seen:
            return kind, seen[port]
        seen[port] = kind
    return None


_K8S_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # a DNS-1123 label
_K8S_SERVICE_NAME = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"  # an RFC 1035 label: Services must start with a letter
_K8S_QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|M|G|T|P)?$"


class KubernetesSpec(_Strict):
    """``trtspec deploy --k8s``: the Kubernetes rollout (triton_repo/k8s). No part of the recipe's digest: how a
    pair is rolled out does not change what is built."""

    app: str | None = Field(
        None, max_length=40, pattern=_K8S_SERVICE_NAME, description="object names; default: name"
    )
    namespace: str | None = Field(None, max_length=63, pattern=_K8S_NAME)
    image: str | None = Field(None, description="trtspec image by tag or digest; default: docker/'s builds")
    gpus: int | None = Field(None, ge=0, le=512, description="GPUs per replica: what the recipe places")
    gpus_per_node: int = Field(8, ge=1, le=64, description="a replica must fit one node")
    node_selector: dict[str, str] = Field(default_factory=dict)
    models_pvc: str | None = Field(None, max_length=63, pattern=_K8S_NAME, description="the checkpoints' PVC")
    engines_pvc: str | None = Field(None, max_length=63, pattern=_K8S_NAME, description="default: made")
    storage_class: str | None = Field(None, max_length=253)
    engines_size: str = Field("200Gi", pattern=_K8S_QUANTITY)
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce"] = "ReadWriteMany"
    cpu: str | None = Field(None, pattern=_K8S_QUANTITY, description="CPU request per serving pod")
    memory: str | None = Field(None, pattern=_K8S_QUANTITY, description="memory request per serving pod")
    min_replicas: int = Field(1, ge=1, le=1000)
    max_replicas: int = Field(4, ge=1, le=1000)
    queue_compute_ratio: float = Field(
        1.0, gt=0, le=1000, description="HPA target: average triton:queue_compute:ratio per replica"
    )
    min_acceptance: float = Field(0.3, ge=0, le=1, description="alert and canary gate: acceptance rate floor")
    min_exact_match: float = Field(1.0, ge=0, le=1, description="canary gate: exact match vs HF")
    canary_replicas: int = Field(1, ge=1, le=64)
    gate_prompts: int = Field(16, ge=1, le=100000, description="prompts the canary gate validates")
    gate_max_tokens: int = Field(32, ge=1, le=65536)
    startup_timeout_s: int = Field(3600, ge=60, le=86400, description="deploy + load before liveness")
    monitoring_labels: dict[str, str] = Field(default_factory=dict, description="e.g. release: prometheus")
    grafana_datasource: str = Field("prometheus", min_length=1, description="the cluster Grafana's uid")

    @field_validator("image")
    @classmethod
    def _pinned(cls, value: str | None) -> str | None:
        if value is None or "@sha256:" in value:
            return value
        tag = value.rsplit("/", 1)[-1].partition(":")[2]
        if not tag or tag == "latest":
            raise ValueError(
                f"pin a tag other than latest, or a digest (e.g. {value.removesuffix(':latest')}:0.1.0)"
            )
        return value

    @model_validator(mode="after")
    def _replicas(self) -> KubernetesSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} > max_replicas {self.max_replicas}")
        return self


def torch_runtime_dtype(triton: TritonSpec, model: ModelSpec) -> str:
    """The dtype the PyTorch engine runs a model in under the torch runtime (fp16 matmuls are slow on CPU)."""
    if triton.torch_dtype != "auto":
        return triton.torch_dtype
    return "float32" if triton.device == "cpu" else model.dtype


class Recipe(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    target: ModelSpec
    draft: ModelSpec | None = (
        None  # none only where prompt lookup proposes alone (speculative.proposer ngram)
    )
    speculative: SpeculativeSpec = SpeculativeSpec()
    limits: LimitsSpec = LimitsSpec()
    calibration: CalibrationSpec = CalibrationSpec()
    triton: TritonSpec = TritonSpec()
    kubernetes: KubernetesSpec = Field(
        KubernetesSpec(), exclude=True, description="the Kubernetes rollout (deploy --k8s)"
    )
    source: Path | None = Field(
        None, strict=False, exclude=True, description="the file this recipe was read from"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if ".." in value:
            raise ValueError(
                "the name must not contain '..' (it names folders under engines/ and triton_repo/)"
            )
        return value

    @model_validator(mode="after")
    def _draft(self) -> Recipe:
        if self.draft is None and self.speculative.proposer != "ngram":
            raise ValueError(
                f"draft: missing; speculative.proposer {self.speculative.proposer!r} needs a draft model "
                "(give draft.model, or set speculative.proposer: ngram for prompt lookup alone)"
            )
        return self

    @model_validator(mode="after")
    def _limits(self) -> Recipe:
        lim = self.limits
        if lim.max_input_len >= lim.max_seq_len:
            raise ValueError(
                f"limits.max_input_len {lim.max_input_len} must be < limits.max_seq_len {lim.max_seq_len}"
            )
        return self

    def draft_ahead_for(self, runtime: str) -> bool:
        """triton.draft_ahead as ``runtime`` can serve it: a fast-logits draft answer (tensorrtllm with fast_logits
        and use_draft_logits) says where the draft's logits are and cannot be cut to the next round's drafts."""
        fast = runtime == "tensorrtllm" and self.triton.fast_logits and self.speculative.use_draft_logits
        return self.triton.draft_ahead and not fast

    def draft_tokenizer_dir(self) -> Path | None:
        """The draft's own tokenizer folder where its tokens reach the target as text: the recipe opts in
        (speculative.heterogeneous_vocab) and the draft's tokenizer is another than the target's. None otherwise:
        one tokenizer, draft tokens go by id (opting in then changes nothing). Reads both tokenizers."""
        from trtspec.core.tokenizers import draft_tokenizer_differs

        draft = self.draft
        if draft is None or not self.speculative.heterogeneous_vocab:
            return None
        trust = self.target.trust_remote_code or draft.trust_remote_code
        return Path(draft.model) if draft_tokenizer_differs(self.target.model, draft.model, trust) else None

    def engine_gpus(self, runtime: str) -> list[int]:
        """The GPUs a served replica's TensorRT-LLM workers take under ``runtime``: the target's and the draft's
        under tensorrtllm, the target's under trtllm-pytorch (the LLM API runs the draft on them), none under
        torch (one process on triton.device)."""
        if runtime == "torch":
            return []
        roles = self.models().values() if runtime == "tensorrtllm" else [self.target]
        return sorted({gpu for spec in roles for gpu in spec.devices})

    def models(self) -> dict[str, ModelSpec]:
        """The recipe's models by role (no draft where prompt lookup proposes alone)."""
        return {"target": self.target, **({"draft": self.draft} if self.draft is not None else {})}

    def digest(self) -> str:
        """A stable hash of every field (model paths included, the recipe's own location excluded)."""
        payload = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _set_dotted(data: dict, dotted: str, value: Any, source: Path | str) -> None:
    """Set a command-line option's field in the recipe's data, refusing a section that cannot hold it as the
    recipe's own check would (an empty section is an error with or without the option)."""
    node = data
    *parents, leaf = dotted.split(".")
    for depth, key in enumerate(parents):
        node = node.setdefault(key, {})
        section = ".".join(parents[: depth + 1])
        if node is None:
            raise RecipeError(source, section, "empty section; give its fields or remove it")
        if not isinstance(node, dict):
            raise RecipeError(
                source, section, f"must be a mapping to take {dotted} from the command line (got {node!r})"
            )
    node[leaf] = value


def _fields_at(loc: tuple) -> list[str]:
    """The field names of the recipe section at ``loc`` (empty if ``loc`` leads outside the models)."""
    model: Any = Recipe
    for part in loc:
        field = getattr(model, "model_fields", {}).get(part)
        annotation = field.annotation if field else None
        # an optional section (``ModelSpec | None``): the model among the union's members
        model = next((a for a in get_args(annotation) if hasattr(a, "model_fields")), annotation)
    return list(getattr(model, "model_fields", {}))


def _format_validation_error(path: Path | str, err: ValidationError) -> RecipeError:
    """The first error as ``field.path: message (got value)``. Union branch tags (``constrained-int``) are left out
    of the path and the branches' messages joined; an unknown key gets the closest field name."""
    import difflib

    def clean(loc) -> tuple:
        return tuple(p for p in loc if isinstance(p, int) or str(p).isidentifier())

    errors = err.errors()
    first = errors[0]
    if first["type"] == "missing":  # a misspelt required field is missing and unknown: name the misspelling
        section = clean(first["loc"])[:-1]
        first = next(
            (e for e in errors if e["type"] == "extra_forbidden" and clean(e["loc"])[:-1] == section), first
        )
    loc = clean(first["loc"])
    field = ".".join(str(p) for p in loc) or None
    messages = [e["msg"].removeprefix("Value error, ") for e in errors if clean(e["loc"]) == loc]
    message = " or ".join(dict.fromkeys(messages))
    if first["type"] == "extra_forbidden":
        known = _fields_at(loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean '{close[0]}'? " if close else f"known: {', '.join(known)}; " if known else ""
        message = f"unknown field; {hint}builders/README.md documents every field"
    elif first["type"] == "missing":
        message = "required field missing; add it (builders/README.md documents every field)"
    elif first["type"] == "model_type" and first.get("input") is None:  # an empty section: YAML null
        message = "empty section; give its fields or remove it"
    elif not isinstance(first.get("input"), dict):  # not a whole section
        value = first.get("input")
        message += f" (got {value!r})"
        if isinstance(value, str) and _reads_as(first["type"], value):
            message += "; a quoted value is text in YAML: remove the quotes"
    return RecipeError(path, field, message, detail=str(err))


def _reads_as(error_type: str, text: str) -> bool:
    """Whether ``text`` unquoted is the number or boolean a field of this pydantic error type wants."""
    if error_type == "bool_type":
        return text.strip().lower() in ("true", "false")
    convert = {"int_type": int, "float_type": float}.get(error_type)
    try:
        return convert is not None and convert(text) is not None
    except ValueError:
        return False


def recipe_from_dict(
    data: dict, *, source: Path | str = "<recipe>", base_dir: Path | None = None, check_paths: bool = True
) -> Recipe:
    """Validate a raw mapping into a Recipe; errors name the source, the field path and the value."""
    base = base_dir if base_dir is not None else Path.cwd()
    try:
        recipe = Recipe.model_validate(data, context={"base_dir": base, "check_paths": check_paths})
    except ValidationError as err:
        raise _format_validation_error(source, err) from None
    return recipe.model_copy(update={"source": Path(source) if source != "<recipe>" else None})


def _unique_key_loader():
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        """safe_load that refuses a key given twice in one mapping (PyYAML silently keeps the last)."""

        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` merges; not a key of its own
                    continue
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, str | int | float | bool) and key is not None:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"a key must be a name, got {key!r}", key_node.start_mark
                    )
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key '{key}' is given twice; keep one", key_node.start_mark
                    )
                seen.add(key)
            return super().construct_mapping(node, deep)

    return UniqueKeyLoader


def resolve_recipe_path(path: str | Path) -> Path:
    """``demo`` names the shipped demo recipe; anything else is a file path, ``~`` expanded as the recipe's model
    paths are (an environment variable or a quoted argument reaches us unexpanded)."""
    if str(path) == "demo":
        return DEMO_RECIPE
    try:
        return Path(path).expanduser()
    except RuntimeError:  # ~user of no such user, or no home folder
        raise RecipeError(
            path, None, "cannot expand ~ (no such user, or no home folder); give the recipe's full path"
        ) from None


def _read_yaml(path: Path) -> dict:
    """The recipe file's raw mapping (RecipeError naming the file for unreadable text, bad YAML, a non-mapping)."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise RecipeError(
            path, None, f"cannot read the recipe ({err.strerror}); pass an existing YAML file"
        ) from None
    except UnicodeDecodeError as err:
        raise RecipeError(
            path, None, f"not UTF-8 text (byte {err.start}); save the recipe as UTF-8"
        ) from None
    try:
        data = yaml.load(text, Loader=_unique_key_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else None
        raise RecipeError(path, where, f"not valid YAML: {getattr(err, 'problem', err)}") from None
    if not isinstance(data, dict):
        raise RecipeError(path, None, "a recipe must be a YAML mapping (see builders/README.md)")
    return data


def load_recipe(
    path: str | Path, overrides: dict[str, Any] | None = None, *, check_paths: bool = True
) -> Recipe:
    """Read, override and validate a recipe file. ``overrides`` maps dotted field paths to values (None = unset)."""
    path = resolve_recipe_path(path)
    data = _read_yaml(path)
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, dotted, value, path)
    real = path.resolve()
    return recipe_from_dict(data, source=path, base_dir=real.parent, check_paths=check_paths)


# Fields holding paths that resolve against the recipe's folder (besides the demo: scheme and 'builtin').
_PATH_FIELDS = (("target", "model"), ("draft", "model"), ("calibration", "dataset"))


def recipe_copy(
    path: str | Path, changes: dict[str, Any], dest: Path, header: str = "", *, check_paths: bool = True
) -> str:
    """The YAML text of a copy of recipe ``path`` with ``changes`` (dotted field -> value; None removes the field),
    to be saved at ``dest``: relative paths are made absolute so they still name the same files from there, and
    the copy is validated as a recipe (RecipeError naming ``dest`` otherwise). Comments are not kept; ``header``
    (comment lines) goes first. ``check_paths`` False: a model folder that does not exist yet (written beside the
    copy) is not an error."""
    import yaml

    path = resolve_recipe_path(path)
    data = _read_yaml(path)
    base = path.resolve().parent
    for section, key in _PATH_FIELDS:
        value = (data.get(section) or {}).get(key) if isinstance(data.get(section), dict) else None
        if isinstance(value, str) and not value.startswith(DEMO_SCHEME) and value != "builtin":
            data[section][key] = str(resolve_model_path(value, base))
    for dotted, value in changes.items():
        if value is None:
            *parents, leaf = dotted.split(".")
            node = data
            for key in parents:
                node = node.get(key) if isinstance(node, dict) else None
            if isinstance(node, dict):
                node.pop(leaf, None)
        else:
            _set_dotted(data, dotted, value, dest)
    recipe_from_dict(data, source=dest, base_dir=Path(dest).absolute().parent, check_paths=check_paths)
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
