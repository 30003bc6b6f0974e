"""Multi-GPU deployments: target tp=2 on GPUs 0,1 and the draft on GPU 2 -> per-engine gpu_device_ids and
participant ids, and the launch upstream's launch_triton_server.py would run (mpirun ranks, world size, per-rank
models, --multi-model environment), plus per-rank memory estimates.

No GPU here: the engines are engine directories with TensorRT-LLM 1.2's config.json layout (as in test_deploy).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_deploy import fake_engine

from trtspec.builders.model_facts import ModelFacts
from trtspec.builders.preflight import check_serving_memory, estimate_memory
from trtspec.recipe import recipe_from_dict
from trtspec.triton_repo import interface as names
from trtspec.triton_repo.deploy import MANIFEST, deploy
from trtspec.triton_repo.render import parse_model_config
from trtspec.triton_repo.serve import launch_layout_of
from trtspec.triton_repo.server import Ports, launch_command, launch_env
from trtspec.triton_repo.values import launch_layout

PORTS = Ports(http=18000, grpc=18001, metrics=18002)


def split_recipe(runtime="tensorrtllm", fast_logits=False, **target):
    data = {
        "name": "split",
        "target": {"model": "/models/target", "tp_size": 2, "gpu_ids": [0, 1], **target},
        "draft": {"model": "/models/draft", "gpu_ids": [2]},
        "speculative": {"max_draft_len": 4},
        "triton": {"runtime": runtime, "fast_logits": fast_logits},
    }
    return recipe_from_dict(data, check_paths=False)


@pytest.fixture
def engines(tmp_path):
    return {
        "target": fake_engine(tmp_path / "e" / "target", max_draft_len=4, tp_size=2),
        "draft": fake_engine(tmp_path / "e" / "draft", max_draft_len=0),
    }


def test_deploy_refuses_engines_built_for_another_tp_pp_than_the_recipe(tmp_path, engines):
    """TensorRT-LLM's executor checks the orchestrator's participant ids (the recipe's GPUs) against the engine's
    own tp x pp and fails the load: deploy says so first."""
    from trtspec.core.errors import CheckFailed

    with pytest.raises(
        CheckFailed, match=r"target engine is built for tp_size 2 x pp_size 1 and the recipe's "
    ):
        deploy(
            split_recipe(tp_size=4, gpu_ids=[0, 1, 3, 4]),
            "tensorrtllm",
            tmp_path / "repo",
            engine_dirs=engines,
        )
    assert not (tmp_path / "repo").exists()


def test_deploy_refuses_fast_logits_beside_prompt_lookup_as_check_does(tmp_path):
    """Every request not pinning the draft would be refused by the orchestrator (a looked-up proposal has no draft
    logits to pass from rank to rank): deploy refuses the repository, whatever runtime the recipe names."""
    from trtspec.core.errors import CheckFailed

    data = split_recipe(fast_logits=True).model_dump(mode="json")
    data["speculative"] |= {"proposer": "draft+ngram", "use_draft_logits": True}
    data["triton"]["runtime"] = "torch"  # deploy's --runtime decides, not the recipe's
    recipe = recipe_from_dict(data, check_paths=False)
    engines = {
        "target": fake_engine(tmp_path / "e" / "target", max_draft_len=4, tp_size=2, gather=True),
        "draft": fake_engine(tmp_path / "e" / "draft", max_draft_len=0, gather=True),
    }
    with pytest.raises(CheckFailed, match="looked-up proposals have no draft logits"):
        deploy(recipe, "tensorrtllm", tmp_path / "repo", engine_dirs=engines)
    assert not (tmp_path / "repo").exists()


def params(repo, model) -> dict[str, str]:
    config = parse_model_config((repo / model / "config.pbtxt").read_text(), model)
    return {k: v.string_value for k, v in config.parameters.items()}


def ranks(cmd: list[str]) -> list[list[str]]:
    """Split an mpirun argv at ':' into per-rank argvs (without the leading 'mpirun ...' / '-n 1')."""
    assert cmd[:2] == ["mpirun", "--allow-run-as-root"]
    out, current = [], []
    for arg in cmd[2:] + [":"]:
        if arg == ":":
            assert current[:2] == ["-n", "1"]
            out.append(current[2:])
            current = []
        else:
            current.append(arg)
    return out


def test_split_pair_gets_its_gpus_and_the_orchestrator_launch(tmp_path, engines):
    repo = tmp_path / "repo"
    deploy(split_recipe(), "tensorrtllm", repo, engine_dirs=engines)
    assert params(repo, names.TARGET_MODEL)["gpu_device_ids"] == "0,1"
    assert params(repo, names.DRAFT_MODEL)["gpu_device_ids"] == "2"
    assert params(repo, names.TARGET_MODEL)["participant_ids"] == ""  # spawned workers, no pre-spawned ranks
    info = json.loads((repo / MANIFEST).read_text())
    layout = launch_layout_of(info)
    assert info["gpu_ids"] == {"target": [0, 1], "draft": [2]}
    assert (layout["mode"], layout["world_size"], layout["mpi"]) == ("orchestrator", 1, True)
    # --multi-model without --disable-spawn-processes: world size 1, the backend spawns each model's ranks.
    assert launch_env(layout, {}) == {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}
    (rank0,) = ranks(launch_command(repo, PORTS, layout))
    assert rank0[0] == "tritonserver" and f"--model-repository={repo.resolve()}" in rank0
    assert "--http-port=18000" in rank0 and "--http-address=127.0.0.1" in rank0
    assert [a for a in rank0 if a.startswith("--cuda-memory-pool-byte-size")] == [
        f"--cuda-memory-pool-byte-size={gpu}:0" for gpu in (0, 1, 2)
    ]
    assert rank0[-2:] == [
        "--disable-auto-complete-config",
        "--backend-config=python,shm-region-prefix-name=prefix0_",
    ]


def test_fast_logits_prespawns_one_rank_per_gpu_plus_the_orchestrator(tmp_path, engines):
    repo = tmp_path / "repo"
    deploy(split_recipe(fast_logits=True), "tensorrtllm", repo, engine_dirs=engines)
    target, draft = params(repo, names.TARGET_MODEL), params(repo, names.DRAFT_MODEL)
    # Rank 0 is the orchestrator (the entry model); then draft ranks, then target ranks.
    assert (draft["participant_ids"], target["participant_ids"]) == ("1", "2,3")
    assert (draft["gpu_device_ids"], target["gpu_device_ids"]) == ("2", "0,1")
    assert target["speculative_decoding_fast_logits"] == draft["speculative_decoding_fast_logits"] == "1"
    layout = launch_layout_of(json.loads((repo / MANIFEST).read_text()))
    assert (layout["mode"], layout["world_size"]) == ("orchestrator-prespawn", 1 + 1 + 2)
    assert launch_env(layout, {"PATH": "/bin"}) == {
        "PATH": "/bin",
        "TRTLLM_ORCHESTRATOR": "1",
        "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "0",
    }
    per_rank = ranks(launch_command(repo, PORTS, layout))
    assert len(per_rank) == 4
    assert "--http-port=18000" in per_rank[0] and "--model-control-mode=explicit" not in per_rank[0]
    for rank, args in enumerate(per_rank[1:], start=1):
        loads = [a for a in args if a.startswith("--load-model=")]
        assert "--model-control-mode=explicit" in args
        assert loads == ["--load-model=tensorrt_llm", "--load-model=tensorrt_llm_draft"]
        assert "--allow-http=false" in args and not any(a.startswith("--http-port") for a in args)
        assert args[-1] == f"--backend-config=python,shm-region-prefix-name=prefix{rank}_"
    # Pre-spawned ranks own their GPUs through participant ids: no memory-pool overrides.
    assert not any(a.startswith("--cuda-memory-pool") for args in per_rank for a in args)


def test_two_tensorrt_llm_models_always_launch_with_multi_model_and_torch_without_mpi(tmp_path):
    data = {"name": "one", "target": {"model": "/t"}, "draft": {"model": "/d"}}
    recipe = recipe_from_dict(data, check_paths=False)
    assert launch_layout(recipe, "torch") == launch_layout_of({})
    # One GPU for both: still --multi-model, as upstream's draft-target README launches the pair.
    layout = launch_layout(recipe, "tensorrtllm")
    assert (layout["mode"], layout["world_size"], layout["gpus"]) == ("orchestrator", 1, [0])
    assert launch_env(layout, {}) == {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}
    moved = recipe_from_dict(data | {"draft": {"model": "/d", "gpu_ids": [1]}}, check_paths=False)
    assert launch_layout(moved, "tensorrtllm")["mode"] == "orchestrator"


def test_pipeline_parallel_counts_in_the_world_size():
    recipe = split_recipe(fast_logits=True, pp_size=2, gpu_ids=[0, 1, 3, 4])
    layout = launch_layout(recipe, "tensorrtllm")
    assert layout["world_size"] == 1 + 1 + 4 and layout["participant_ids"]["target"] == "2,3,4,5"


def test_llmapi_runs_one_leader_on_the_target_gpus():
    layout = launch_layout(split_recipe("trtllm-pytorch"), "trtllm-pytorch")
    assert (layout["mode"], layout["world_size"]) == ("llmapi", 1)
    assert launch_env(layout, {}) == {"CUDA_VISIBLE_DEVICES": "0,1"}
    (rank0,) = ranks(launch_command("/repo", PORTS, layout))
    assert not any(a.startswith("--cuda-memory-pool") for a in rank0)


def test_memory_is_estimated_per_rank_and_summed_per_gpu():
    recipe = split_recipe()
    facts = {
        role: ModelFacts(role, "/m", "LlamaForCausalLM", 32000, 4096, 32, 8, 128, params, tokenizer=None)
        for role, params in (("target", 8_000_000_000), ("draft", 1_000_000_000))
    }
    rows = [estimate_memory(facts[r], getattr(recipe, r), recipe) for r in ("target", "draft")]
    target, draft = rows
    assert target.gpus == (0, 1) and draft.gpus == (2,)
    assert target.weights_gib == pytest.approx(8e9 * 2 / 2 / 2**30)  # fp16 weights split over tp=2
    assert draft.weights_gib == pytest.approx(1e9 * 2 / 2**30)
    kv_per_token = 2 * 32 * 8 * 128 * 2
    assert target.kv_cache_gib == pytest.approx(kv_per_token * 8 * 1024 / 2 / 2**30)
    result = check_serving_memory(rows, gpu_memory_gib=None)
    assert "on GPU 0" in result.message or "on GPU 1" in result.message  # the target's ranks are the peak


def test_an_mpi_launch_without_mpirun_is_one_clear_error(tmp_path):
    from pathlib import Path

    from trtspec.core.errors import ServerError
    from trtspec.triton_repo.server import ServerInstall, TritonServer

    layout = launch_layout(split_recipe(), "tensorrtllm")
    binary, backends = Path("/opt/tritonserver/bin/tritonserver"), Path("/opt/tritonserver/backends")
    install = ServerInstall(binary, backends, {"PATH": str(tmp_path)}, "ngc")  # no mpirun on this PATH
    server = TritonServer(tmp_path, PORTS, tmp_path / "log", install, layout)
    assert server.command[0] == "mpirun" and server.env["TRTLLM_ORCHESTRATOR"] == "1"
    with pytest.raises(
        ServerError, match="^mpirun not found: the orchestrator launch needs the NGC TensorRT-LLM"
    ):
        server.start(1)
    assert server.proc is None and not (tmp_path / "log").exists()


def test_a_manifest_without_a_usable_launch_layout_is_one_line_where_the_runtime_needs_one():
    """A torch repository from before the launch field runs single; an engine repository cannot be started
    without knowing how (mpirun, --multi-model), and a hand-edited launch is named, not a traceback."""
    from trtspec.core.errors import ServerError

    assert (
        launch_layout_of({"runtime": "torch"}, "r")
        == launch_layout_of({})
        == launch_layout(
            recipe_from_dict(
                {"name": "one", "target": {"model": "/t"}, "draft": {"model": "/d"}}, check_paths=False
            ),
            "torch",
        )
    )
    with pytest.raises(ServerError) as refused:
        launch_layout_of({"runtime": "tensorrtllm"}, "r")
    assert refused.value.message == (
        "r/trtspec.json: no launch layout for the tensorrtllm runtime; write the repository again with "
        "`trtspec deploy`"
    )
    for launch in ("single", {"mpi": True}):
        with pytest.raises(ServerError, match=r"^r/trtspec.json: launch is not a launch layout \(got "):
            launch_layout_of({"runtime": "tensorrtllm", "launch": launch}, "r")


def test_the_server_log_lies_beside_the_repository_named_after_its_folder(tmp_path, monkeypatch):
    from trtspec.triton_repo.serve import server_log_path

    repo = tmp_path / "repo"
    repo.mkdir()
    (tmp_path / "link").symlink_to(repo)
    monkeypatch.chdir(repo)
    for named in (repo, ".", tmp_path / "link"):
        assert server_log_path(named) == tmp_path / ".repo.tritonserver.log"


def test_the_exit_timeout_reaches_every_rank_and_bounds_the_stop(tmp_path):
    """serve --exit-timeout: how long tritonserver lets requests in flight run once asked to stop, on a single
    server and on every MPI rank; the session is killed only once that and serve's own margin have passed."""
    from trtspec.triton_repo.server import (
        EXIT_TIMEOUT_S,
        STOP_GRACE_S,
        ServerInstall,
        TritonServer,
        server_command,
    )

    install = ServerInstall(Path("/bin/tritonserver"), Path("/backends"), {}, "ngc")
    assert "--exit-timeout-secs=15" in server_command(install, Path("/repo"), PORTS)
    assert "--exit-timeout-secs=65" in server_command(install, Path("/repo"), PORTS, 65)
    layout = {"mode": "orchestrator", "mpi": True, "world_size": 1, "env": {}, "gpus": [0]}
    (rank0,) = ranks(launch_command("/repo", PORTS, layout, exit_timeout_s=65))
    assert "--exit-timeout-secs=65" in rank0
    server = TritonServer(Path("/repo"), PORTS, tmp_path / "log", install, layout, exit_timeout_s=65)
    assert all("--exit-timeout-secs=65" in rank for rank in ranks(server.command))

    assert server.stop_grace_s == 65 + STOP_GRACE_S - EXIT_TIMEOUT_S
    assert TritonServer(Path("/repo"), PORTS, tmp_path / "log", install).stop_grace_s == STOP_GRACE_S


def test_serve_takes_the_exit_timeout_it_hands_to_tritonserver(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from trtspec.cli import cli
    from trtspec.triton_repo import serve as serve_module

    taken = []
    monkeypatch.setattr(serve_module, "serve", lambda spec, echo, on_ready: taken.append(spec) or 0)
    result = CliRunner().invoke(cli, ["serve", str(tmp_path), "--exit-timeout", "65"])
    assert result.exit_code == 0, result.output
    assert taken[0].exit_timeout_s == 65
    result = CliRunner().invoke(cli, ["serve", str(tmp_path)])
    assert taken[1].exit_timeout_s == 15
    # the help states the server module's default: the CLI does not import that module at start (it pulls in the
    # recipe's pydantic models, a quarter of a second)
    from trtspec.triton_repo.server import EXIT_TIMEOUT_S

    helped = CliRunner().invoke(cli, ["serve", "--help"], terminal_width=400)
    assert f"[default: {EXIT_TIMEOUT_S}]" in " ".join(helped.output.split())
