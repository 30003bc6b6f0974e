"""What every object of a rollout shares, derived from the recipe once, and the checks that refuse bad values
before anything is written (each a one-line RecipeError naming the field).

Inside the pods the recipe file is mounted as it was written, at /workspace/recipes/recipe.yaml, beside the
folders docker/Dockerfile makes: relative model paths resolve from there, so they must land under
/workspace/models, where the models volume is mounted (``demo:`` models ship inside the image).
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from dataclasses import dataclass, field

from trtspec.builders.support import multi_node_problem
from trtspec.core.errors import RecipeError
from trtspec.core.trtllm import NGC_TRITON_TRTLLM_IMAGE, TRTLLM_VERSION
from trtspec.recipe import DEMO_SCHEME, Recipe

RUNTIMES = ("torch", "tensorrtllm", "trtllm-pytorch")
# The container's folders (docker/Dockerfile's ENV and WORKDIR).
RECIPES_MOUNT = "/workspace/recipes"
RECIPE_FILE = "recipe.yaml"
MODELS_MOUNT = "/workspace/models"
ENGINES_MOUNT = "/workspace/engines"
REPO_MOUNT = "/workspace/triton_repo"
CONTAINER_UID = 1000  # triton-server in the NGC image, trtspec in Dockerfile.cpu: owner of written volumes


@dataclass(frozen=True)
class RolloutPlan:
    """One recipe's rollout: ``gpus`` per replica (one pod of a Deployment), ``key`` names what is built once per
    recipe and image (its folder in the engines volume and the marker the build leaves there)."""

    recipe: Recipe
    runtime: str
    app: str
    image: str
    base_image: str | None
    key: str
    gpus: int
    models_pvc: str | None
    engines_pvc: str | None
    create_engines_pvc: bool
    recipe_text: str
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def builds(self) -> bool:
        """Whether a Job builds into the engines volume before serving (torch serves the checkpoints)."""
        return self.runtime != "torch"

    @property
    def device(self) -> str:
        """Where the canary gate runs its Hugging Face reference."""
        return "cuda" if self.gpus else "cpu"

    @property
    def recipe_path(self) -> str:
        return f"{RECIPES_MOUNT}/{RECIPE_FILE}"

    @property
    def repo_path(self) -> str:
        return f"{REPO_MOUNT}/{self.recipe.name}"

    @property
    def engines_dir(self) -> str:
        """This key's own folder in the engines volume: a canary's build never writes over the engines production
        serves, and a rolled-back Deployment finds its own engines again."""
        return f"{ENGINES_MOUNT}/{self.key}"

    @property
    def engines_marker(self) -> str:
        """The file the build Job writes last: engines for this recipe and image are complete."""
        return f"{self.engines_dir}/.trtspec-k8s-built.json"

    @property
    def exports_spec_metrics(self) -> bool:
        """Whether the serving pods export trtspec's counters (trtllm-pytorch serves upstream's model, which has
        none): the rules and alerts that read them are written only then."""
        return self.runtime != "trtllm-pytorch"


def default_app(name: str) -> str:
    """A recipe name as a Service name (an RFC 1035 label: lowercase letters, digits and '-', starting with a
    letter), at most 40 characters."""
    app = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if app and not app[0].isalpha():
        app = f"trtspec-{app}"
    return app[:40].strip("-") or "trtspec"


def default_image(runtime: str, device: str) -> tuple[str, str | None]:
    """(image, the NGC image it is built FROM): the tags docker/compose.yaml gives docker/Dockerfile's and
    Dockerfile.cpu's builds."""
    from trtspec import __version__

    if runtime == "torch" and device == "cpu":
        return f"trtspec:{__version__}-cpu", None
    return f"trtspec:{__version__}-trtllm{TRTLLM_VERSION}", NGC_TRITON_TRTLLM_IMAGE


def placed_gpus(recipe: Recipe, runtime: str) -> tuple[int, str]:
    """(GPUs one replica needs, how the recipe places them): the engine workers' GPUs that ``serve`` launches on."""
    if runtime == "torch":
        if recipe.triton.device == "cpu":
            return 0, "the torch runtime on triton.device cpu"
        return 1, "the torch runtime on triton.device cuda (both models in one process)"
    gpus = recipe.engine_gpus(runtime)
    t = recipe.target
    how = f"target tp_size {t.tp_size} x pp_size {t.pp_size}"
    draft = recipe.draft  # None: prompt lookup proposes alone
    if runtime == "tensorrtllm" and draft is not None and set(draft.devices) - set(t.devices):
        how += f", draft on GPUs {list(draft.devices)}"
    return len(gpus), f"{how}: GPUs {gpus}"


def _fail(recipe: Recipe, field_path: str, message: str) -> RecipeError:
    return RecipeError(recipe.source or "<recipe>", field_path, message)


def pod_model_path(raw: str) -> str | None:
    """Where a recipe's model path points inside the pods (None: a demo model, inside the image)."""
    if raw.startswith(DEMO_SCHEME):
        return None
    return posixpath.normpath(posixpath.join(RECIPES_MOUNT, raw))


def check_models(recipe: Recipe, raw: dict) -> bool:
    """Every model folder, and a calibration file, is under the models mount (or a demo model, the builtin
    data); True when the models volume is needed. The pods load the recipe, which checks its files exist."""
    needs_volume = False
    dataset = str((raw.get("calibration") or {}).get("dataset", "builtin"))
    paths = {f"{role}.model": str((raw.get(role) or {}).get("model", "")) for role in ("target", "draft")}
    paths["calibration.dataset"] = "" if dataset == "builtin" else dataset
    for name, value in paths.items():
        path = pod_model_path(value) if value else None  # no draft (prompt lookup alone), builtin data
        if path is None:
            continue
        if not (path + "/").startswith(MODELS_MOUNT + "/"):
            raise _fail(
                recipe,
                name,
                f"{value} is {path} inside the pods, outside {MODELS_MOUNT} where kubernetes.models_pvc is mounted; "
                f"name it {MODELS_MOUNT}/<path> (as docker/compose.yaml does)",
            )
        needs_volume = True
    if needs_volume and recipe.kubernetes.models_pvc is None:
        raise _fail(
            recipe,
            "kubernetes.models_pvc",
            f"the models are read from {MODELS_MOUNT} in the pods; name the PersistentVolumeClaim that holds them",
        )
    return needs_volume


def check_nodes(recipe: Recipe, runtime: str, gpus: int) -> None:
    """A replica is one pod on one node."""
    problem = multi_node_problem(runtime, gpus, recipe.kubernetes.gpus_per_node)
    if problem is not None:
        raise _fail(recipe, *problem)


def check_gpu_ids(recipe: Recipe, runtime: str) -> None:
    """Inside a pod the device plugin numbers the pod's GPUs from 0, whatever they are on the node: the engine
    workers' GPUs must be 0..N-1 (the repository names them in gpu_device_ids, CUDA_VISIBLE_DEVICES)."""
    if runtime == "torch":
        return
    gpus = sorted(set(recipe.engine_gpus(runtime)))
    if gpus != list(range(len(gpus))):
        roles = [role for role, spec in recipe.models().items() if set(spec.devices) - set(range(len(gpus)))]
        raise _fail(
            recipe,
            f"{roles[0] if roles else 'target'}.gpu_ids",
            f"GPUs {gpus}: a pod sees its {len(gpus)} GPU(s) as 0..{len(gpus) - 1}, whichever they are on the node; "
            f"name them {list(range(len(gpus)))}",
        )


def rollout_key(recipe: Recipe, runtime: str, image: str) -> str:
    return hashlib.sha256(f"{recipe.digest()}|{runtime}|{image}".encode()).hexdigest()[:10]


def plan_rollout(recipe: Recipe, runtime: str | None, recipe_text: str) -> RolloutPlan:
    """Check the rollout values of ``recipe`` (RecipeError naming the field) and derive the plan.
    ``recipe_text``: the recipe file as the pods will read it."""
    import yaml

    runtime = runtime or recipe.triton.runtime
    if runtime not in RUNTIMES:
        raise _fail(
            recipe, "triton.runtime", f"'{runtime}' cannot be rolled out; choose one of {', '.join(RUNTIMES)}"
        )
    spec = recipe.kubernetes
    # the three container ports, set and distinct, as probes and Services name them
    ports = recipe.triton.ports
    gpus, how = placed_gpus(recipe, runtime)
    if spec.gpus is not None and spec.gpus != gpus:
        raise _fail(
            recipe,
            "kubernetes.gpus",
            f"{spec.gpus} does not match the {gpus} GPU(s) of {how}; set {gpus} or leave it out",
        )
    check_nodes(recipe, runtime, gpus)
    check_gpu_ids(recipe, runtime)
    models = check_models(recipe, yaml.safe_load(recipe_text) or {})
    device = "cuda" if gpus else "cpu"
    image, base = (spec.image, None) if spec.image else default_image(runtime, device)
    app = spec.app or default_app(recipe.name)
    builds = runtime != "torch"
    return RolloutPlan(
        recipe=recipe,
        runtime=runtime,
        app=app,
        image=image,
        base_image=base,
        key=rollout_key(recipe, runtime, image),
        gpus=gpus,
        models_pvc=spec.models_pvc if models else None,
        engines_pvc=(spec.engines_pvc or f"{app}-engines") if builds else None,
        create_engines_pvc=builds and spec.engines_pvc is None,
        recipe_text=recipe_text,
        ports=ports,
    )
