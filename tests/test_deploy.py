"""`trtspec deploy`: strict rendering, Triton's schema, cross-model checks, atomic output, both runtimes."""

from __future__ import annotations

import json

import pytest
from harness.repo import engine_config, fake_engine
from tritonclient.grpc import model_config_pb2

from trtspec.core.errors import CheckFailed, OutputError, RecipeError, ServerError
from trtspec.recipe import recipe_from_dict
from trtspec.triton_repo import interface as names
from trtspec.triton_repo.checks import check_repository
from trtspec.triton_repo.deploy import MANIFEST, deploy, render_models
from trtspec.triton_repo.render import parse_model_config, read_template, render_template, template_keys
from trtspec.triton_repo.server import Ports
from trtspec.triton_repo.values import UPSTREAM_TRTLLM_KEYS, plan_models


def make_recipe(tiny_pair, **sections) -> object:
    target, draft = tiny_pair
    data = {"name": "tiny", "target": {"model": str(target)}, "draft": {"model": str(draft)}}
    data.update(sections)
    return recipe_from_dict(data)


@pytest.fixture
def engines(tmp_path):
    return {
        "target": fake_engine(tmp_path / "engines" / "target", max_draft_len=4),
        "draft": fake_engine(tmp_path / "engines" / "draft", max_draft_len=0),
    }


def test_render_is_strict():
    assert render_template("a ${x} b", {"x": 1}, "t") == "a 1 b"
    with pytest.raises(CheckFailed, match="no value for template key"):
        render_template("a ${x} ${y}", {"x": 1}, "t")
    with pytest.raises(CheckFailed, match="unknown template key"):
        render_template("a ${x}", {"x": 1, "z": 2}, "t")
    with pytest.raises(CheckFailed, match="leftover"):
        render_template("a ${x}", {"x": "${y}"}, "t")


def test_schema_rejects_unknown_fields_and_bad_enums():
    with pytest.raises(CheckFailed, match="has no field named"):
        parse_model_config('name: "m"\nbogus: 1\n', "m/config.pbtxt")
    with pytest.raises(CheckFailed, match="m/config.pbtxt"):
        parse_model_config(
            'name: "m"\ninput [ { name: "x" data_type: TYPE_NOPE dims: [1] } ]\n', "m/config.pbtxt"
        )


def test_tensorrtllm_template_has_exactly_the_upstream_keys():
    keys = template_keys(read_template("tensorrt_llm/config.pbtxt"))
    assert len(UPSTREAM_TRTLLM_KEYS) == 52
    assert keys == UPSTREAM_TRTLLM_KEYS | {"model_name"}


def test_torch_repo_renders_checks_and_writes_atomically(tiny_pair, tmp_path):
    recipe = make_recipe(tiny_pair)
    out = tmp_path / "repo"
    result = deploy(recipe, "torch", out)
    # The entry model runs the draft and the target in-process: no engine models.
    assert result.models == [names.ORCHESTRATOR, names.ENSEMBLE]
    assert "models.inflight import" in (out / names.ORCHESTRATOR / "1" / "model.py").read_text()
    info = json.loads((out / MANIFEST).read_text())
    assert info["runtime"] == "torch" and info["recipe_digest"] == recipe.digest()
    for model in result.models:
        config = parse_model_config((out / model / "config.pbtxt").read_text(), model)
        assert config.name == model and (out / model / "1").is_dir()
    assert [p.name for p in tmp_path.iterdir()] == ["repo"]  # no temp dir left behind
    entry = _params(parse_model_config((out / names.ORCHESTRATOR / "config.pbtxt").read_text(), "entry"))
    # The entry model tokenises and detokenises in-process.
    assert entry["tokenizer_dir"] == str(tiny_pair[0]) and entry["max_input_len"] != ""
    assert entry["add_special_tokens"] == entry["skip_special_tokens"] == "True"
    assert entry["cpu_threads"] == "auto" and entry["target_dtype"] == entry["draft_dtype"] == "float32"
    assert (entry["target_model_dir"], entry["draft_model_dir"]) == tuple(map(str, tiny_pair))
    # Redeploying replaces the repository in one rename.
    deploy(recipe, "torch", out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]


def test_model_paths_with_a_backslash_or_a_quote_reach_the_entry_model_as_given(tiny_pair, tmp_path):
    """config.pbtxt holds paths inside protobuf text strings: a backslash would be read as an escape (\\t a tab)
    and a quote would end the string, so both are escaped when rendered."""
    import shutil

    target = shutil.copytree(tiny_pair[0], tmp_path / "odd\\tdir" / 'say "hi"' / "target")
    recipe = make_recipe((target, tiny_pair[1]))
    deploy(recipe, "torch", tmp_path / "repo")
    entry = _params(
        parse_model_config((tmp_path / "repo" / names.ORCHESTRATOR / "config.pbtxt").read_text(), "e")
    )
    assert entry["target_model_dir"] == str(target) and entry["tokenizer_dir"] == str(target)


def test_serve_binds_what_the_recipe_deployed_unless_the_command_line_says_otherwise(tiny_pair, tmp_path):
    """triton.host and the ports reach `trtspec serve` through the manifest; --host and the port options win."""
    from trtspec.triton_repo.serve import ServeSpec, read_manifest, resolve_ports, sample_requests

    triton = {"host": "0.0.0.0", "http_port": 9000, "grpc_port": 9001, "metrics_port": 9002}
    out = tmp_path / "repo"
    deploy(make_recipe(tiny_pair, triton=triton), "torch", out)
    ports = resolve_ports(ServeSpec(repo=out), read_manifest(out))
    assert (ports.host, ports.http, ports.grpc, ports.metrics) == ("0.0.0.0", 9000, 9001, 9002)
    # A client on this machine reaches a bind-all server on loopback.
    assert (ports.http_url, ports.grpc_url) == ("127.0.0.1:9000", "127.0.0.1:9001")
    assert ports.metrics_url == "http://127.0.0.1:9002/metrics"
    assert all("127.0.0.1:900" in line for line in sample_requests(ports))
    given = resolve_ports(ServeSpec(repo=out, host="10.1.2.3", http_port=7000), read_manifest(out))
    assert (given.host, given.http, given.grpc) == ("10.1.2.3", 7000, 9001)
    assert (given.http_url, given.grpc_url) == ("10.1.2.3:7000", "10.1.2.3:9001")
    # A repository trtspec did not write: the recipe's defaults.
    assert resolve_ports(ServeSpec(repo=out), {}) == Ports(8000, 8001, 8002, "127.0.0.1")


def test_serve_refuses_a_broken_manifest_naming_its_field(tiny_pair, tmp_path):
    """A manifest trtspec wrote and someone broke is named, never served with defaults in silence; only a
    repository without one (not trtspec's) takes the defaults."""
    from trtspec.triton_repo.serve import ServeSpec, read_manifest, resolve_ports

    out = tmp_path / "repo"
    deploy(make_recipe(tiny_pair), "torch", out)
    manifest = out / "trtspec.json"
    good = json.loads(manifest.read_text())
    for field, value in [("http", "abc"), ("grpc", 0), ("metrics", True), ("host", "not a host!")]:
        manifest.write_text(json.dumps(good | {"ports": good["ports"] | {field: value}}))
        with pytest.raises(ServerError, match=f"trtspec.json: ports.{field}: .*{value!r}"):
            resolve_ports(ServeSpec(repo=out), read_manifest(out))
    # the command line's value is the one served, so the manifest's broken one does not matter then
    assert resolve_ports(ServeSpec(repo=out, http_port=7000), {"ports": {"http": "abc"}}).http == 7000
    manifest.write_text("{bad")
    with pytest.raises(ServerError, match="trtspec.json: cannot be read as JSON"):
        read_manifest(out)
    manifest.write_text("[]")
    with pytest.raises(ServerError, match="trtspec.json: must be a JSON object"):
        read_manifest(out)
    manifest.unlink()
    assert read_manifest(out) == {}


@pytest.mark.parametrize("host", ["", "two words", "a/b"])
def test_serve_refuses_a_host_that_cannot_be_an_address_before_starting_anything(tmp_path, host):
    """`serve --host ""` is not 'the recipe's host': refused as the recipe's triton.host would be, before the
    repository is read."""
    from click.testing import CliRunner

    from trtspec.cli import cli

    result = CliRunner().invoke(cli, ["serve", str(tmp_path / "missing"), "--host", host])
    assert result.exit_code == 2
    assert (
        "Invalid value for '--host'" in result.output and "not an IP address or a host name" in result.output
    )
    assert f"got {host!r}" in result.output


@pytest.mark.parametrize("host", ["not a host!", "", "two words", "[::1]", "a/b", "x" * 254])
def test_a_recipe_host_that_cannot_be_an_address_is_refused_by_name(tiny_pair, host):
    with pytest.raises(RecipeError, match="triton.host"):
        make_recipe(tiny_pair, triton={"host": host})


@pytest.mark.parametrize("host", ["::", "::1", "fe80::1%eth0"])
def test_an_ipv6_host_is_refused_naming_what_tritonserver_binds(tiny_pair, host):
    """tritonserver 2.51's HTTP and metrics endpoints parse their address as IPv4: an IPv6 literal bound them to
    255.255.255.255 (no client reaches it) while serve waited for readiness it could never see."""
    from click.testing import CliRunner

    from trtspec.cli import cli

    with pytest.raises(RecipeError, match="triton.host: an IPv6 address .* bind IPv4 addresses only"):
        make_recipe(tiny_pair, triton={"host": host})
    result = CliRunner().invoke(cli, ["serve", "missing-repo", "--host", host])
    assert result.exit_code == 2 and "bind IPv4 addresses only" in result.output


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "0.0.0.0", "10.0.0.7", "localhost", "my_host", "triton-0.triton.llm.svc."]
)
def test_a_recipe_host_may_be_an_ip_address_or_a_host_name(tiny_pair, host):
    assert make_recipe(tiny_pair, triton={"host": host}).triton.host == host


def test_serve_refuses_ports_it_could_not_take_before_starting(tmp_path):
    """Another server on the port would answer the readiness polls of this one (a false "ready"), and a host
    with control characters would break the first poll with a traceback."""
    import socket

    from trtspec.core.errors import ServerError
    from trtspec.triton_repo.server import TritonServer, check_ports, free_ports

    http, grpc, metrics = free_ports(3)
    check_ports(Ports(http, grpc, metrics))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", grpc))
        busy.listen()
        with pytest.raises(
            ServerError, match=f"port {grpc} \\(grpc\\) on 127.0.0.1 is in use, perhaps by another"
        ):
            check_ports(Ports(http, grpc, metrics))
        log = tmp_path / "server.log"
        log.write_text("the running server's log")
        with pytest.raises(ServerError, match="in use"):
            TritonServer(tmp_path, Ports(http, grpc, metrics), log, install=object()).start(1)
        assert log.read_text() == "the running server's log"
    with pytest.raises(ServerError, match="ports must differ"):
        check_ports(Ports(http, http, metrics))
    with pytest.raises(ServerError, match="host 'not a host': not an address this machine can bind"):
        check_ports(Ports(http, grpc, metrics, "not a host"))


@pytest.mark.parametrize(("name", "why"), [("my repo", "a space"), ("répo", "non-ASCII characters")])
def test_a_repository_path_the_python_backend_cannot_load_from_is_refused(tiny_pair, tmp_path, name, why):
    """Each python model's stub takes its path as a command-line argument: deploy refuses such a path before
    writing, and serve one written there (it would wait out its load timeout)."""
    from trtspec.core.errors import ServerError
    from trtspec.triton_repo.server import TritonServer

    with pytest.raises(
        OutputError, match=f"has {why}, which Triton's python backend cannot load models from"
    ):
        deploy(make_recipe(tiny_pair), "torch", tmp_path / name / "repo")
    assert not (tmp_path / name).exists()
    moved = tmp_path / name
    deploy(make_recipe(tiny_pair), "torch", tmp_path / "repo").repo.rename(moved)
    with pytest.raises(ServerError, match=f"has {why}"):
        TritonServer(moved, Ports(1, 2, 3), tmp_path / "log", install=object()).start(1)
    # a link without one to such a folder: tritonserver is given the folder the link resolves to
    link = tmp_path / "plain"
    link.symlink_to(moved)
    with pytest.raises(ServerError, match=f"has {why}"):
        TritonServer(link, Ports(1, 2, 3), tmp_path / "log", install=object()).start(1)


def test_refuses_to_overwrite_a_folder_that_is_not_a_repository(tiny_pair, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(OutputError, match="not a trtspec repository"):
        deploy(make_recipe(tiny_pair), "torch", tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    # a link to a repository: the rename that replaces the folder would replace the link and leave the folder stale
    deploy(make_recipe(tiny_pair), "torch", tmp_path / "real")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(OutputError) as refused:
        deploy(make_recipe(tiny_pair), "torch", tmp_path / "link")
    assert refused.value.message == (
        f"--out {tmp_path / 'link'} is a symbolic link; pass the folder it points to, {tmp_path / 'real'}"
    )
    assert (tmp_path / "link").is_symlink() and not list(tmp_path.glob(".link*"))


def test_a_redeploy_keeps_a_config_tuned_by_hand_unless_forced(tiny_pair, tmp_path, runner):
    """A repository served once (the python backend's bytecode beside model.py) is replaced by a redeploy; one
    whose config.pbtxt a user tuned is not, until --force says so, and the command says which file and why."""
    import yaml

    from trtspec.cli import cli

    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {"name": "tiny", "target": {"model": str(tiny_pair[0])}, "draft": {"model": str(tiny_pair[1])}}
        )
    )
    out = tmp_path / "repo"
    deploy_cmd = ["deploy", str(recipe), "--out", str(out)]
    assert runner.invoke(cli, deploy_cmd).exit_code == 0
    cache = out / names.ORCHESTRATOR / "1" / "__pycache__"
    cache.mkdir()
    (cache / "model.cpython-311.pyc").write_bytes(b"\0")
    assert runner.invoke(cli, deploy_cmd).exit_code == 0 and not cache.exists()
    tuned = out / names.ORCHESTRATOR / "config.pbtxt"
    tuned.write_text(tuned.read_text().replace("count: 1", "count: 2"))
    result = runner.invoke(cli, deploy_cmd)
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert f"{names.ORCHESTRATOR}/config.pbtxt was changed since trtspec wrote it" in result.output
    assert "--force" in result.output and "count: 2" in tuned.read_text()
    assert runner.invoke(cli, [*deploy_cmd, "--force"]).exit_code == 0
    assert "count: 2" not in tuned.read_text()
    # the container's entry point (docker/entrypoint.sh) runs plain `trtspec deploy`: its environment says so
    tuned.write_text(tuned.read_text().replace("count: 1", "count: 2"))
    assert runner.invoke(cli, deploy_cmd, env={"TRTSPEC_DEPLOY_FORCE": "1"}).exit_code == 0
    assert "count: 2" not in tuned.read_text()


def test_torch_runtime_refuses_models_that_do_not_load(tiny_pair, tmp_path):
    """The torch engine models load the recipe's checkpoints at server start; deploy finds a broken one first."""
    import shutil

    from trtspec.core.errors import ModelError

    draft = shutil.copytree(tiny_pair[1], tmp_path / "draft")
    weights = draft / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    out = tmp_path / "repo"
    with pytest.raises(ModelError, match="model.safetensors: not a readable safetensors file"):
        deploy(make_recipe((tiny_pair[0], draft)), "torch", out)
    (draft / "config.json").unlink()
    with pytest.raises(ModelError, match="draft model has no config.json"):
        deploy(make_recipe((tiny_pair[0], draft)), "torch", out)
    assert not out.exists()


def _params(config) -> dict[str, str]:
    return {k: v.string_value for k, v in config.parameters.items()}


@pytest.mark.parametrize("runtime", ["torch", "tensorrtllm"])
def test_trust_remote_code_reaches_every_tokenizer_the_entry_model_loads(
    tiny_pair, tmp_path, engines, runtime, monkeypatch
):
    """A recipe that asks for a model's own code gets it in the entry model of either runtime; one that does not,
    never."""
    from trtspec.core import model_dir
    from trtspec.triton_repo.models.text import TextCodec

    loads = []
    real = model_dir.load_tokenizer
    monkeypatch.setattr(model_dir, "load_tokenizer", lambda d, trust=False: loads.append(trust) or real(d))
    for asked in (True, False):
        target = {"model": str(tiny_pair[0]), "trust_remote_code": asked}
        recipe = make_recipe(tiny_pair, target=target, triton={"runtime": runtime})
        out = tmp_path / f"{runtime}-{asked}"
        deploy(recipe, runtime, out, engine_dirs=engines if runtime == "tensorrtllm" else None)
        params = _params(parse_model_config((out / names.ORCHESTRATOR / "config.pbtxt").read_text(), "entry"))
        assert params["trust_remote_code"] == str(asked)
        TextCodec.from_parameters(params)
        assert loads[-1] is asked


def test_tensorrtllm_repo_has_the_draft_target_values(tiny_pair, tmp_path, engines):
    recipe = make_recipe(
        tiny_pair,
        speculative={"max_draft_len": 4},
        target={"model": str(tiny_pair[0]), "gpu_ids": [1]},
        triton={"runtime": "tensorrtllm", "kv_cache_free_gpu_mem_fraction": {"target": 0.6, "draft": 0.3}},
    )
    out = tmp_path / "trt"
    deploy(recipe, "tensorrtllm", out, engine_dirs=engines)
    for model, role, fraction, gpus in (
        (names.TARGET_MODEL, "target", "0.6", "1"),
        (names.DRAFT_MODEL, "draft", "0.3", "0"),
    ):
        config = parse_model_config((out / model / "config.pbtxt").read_text(), model)
        assert config.backend == "tensorrtllm" and config.name == model
        assert config.model_transaction_policy.decoupled is False
        params = _params(config)
        assert params["gpt_model_path"] == str(engines[role].resolve())
        assert params["gpt_model_type"] == "inflight_fused_batching"
        assert params["enable_kv_cache_reuse"] == "True"
        assert params["max_beam_width"] == "1"
        assert params["exclude_input_in_output"] == "False"
        assert params["kv_cache_free_gpu_mem_fraction"] == fraction
        assert params["gpu_device_ids"] == gpus
        assert params["speculative_decoding_fast_logits"] == "0" and params["participant_ids"] == ""
        assert not (out / model / "1" / "model.py").exists()
        assert "${" not in (out / model / "config.pbtxt").read_text()
    bls = parse_model_config((out / names.ORCHESTRATOR / "config.pbtxt").read_text(), "bls")
    assert _params(bls)["tensorrt_llm_model_name"] == "tensorrt_llm"
    assert _params(bls)["tensorrt_llm_draft_model_name"] == "tensorrt_llm_draft"
    assert _params(bls)["accumulate_tokens"] == "False"


@pytest.mark.parametrize(
    "speculative, default_k",
    [
        ({"max_draft_len": 4, "schedule": {1: 4, 4: 2, 16: 0}, "draft_cost_ratio": 0.3}, None),
        ({"max_draft_len": 4, "num_draft_tokens": 3}, 3),
    ],
)
def test_both_entry_models_get_adaptive_k_unless_the_recipe_pins_a_k(
    tiny_pair, engines, speculative, default_k
):
    """The tensorrtllm orchestrator's K parameters are the torch runtime's: "adaptive" with the recipe's schedule
    and draft cost for requests without a num_draft_tokens, unless speculative.num_draft_tokens pins one; and
    each entry model reads them back as the recipe says."""
    from trtspec.engines.adaptive import policy_for
    from trtspec.triton_repo.models.request import Limits, k_policy_from_parameters

    recipe = make_recipe(tiny_pair, speculative=speculative)
    entry = {}
    for runtime in ("torch", "tensorrtllm"):
        configs = render_models(plan_models(recipe, runtime, engines if runtime == "tensorrtllm" else None))
        entry[runtime] = _params(configs[names.ORCHESTRATOR][1])
    keys = ("num_draft_tokens", "k_schedule", "draft_cost_ratio")
    assert {k: entry["tensorrtllm"][k] for k in keys} == {k: entry["torch"][k] for k in keys}
    params = entry["tensorrtllm"]
    assert params["num_draft_tokens"] == (names.ADAPTIVE if default_k is None else str(default_k))
    assert Limits.from_parameters(params).num_draft_tokens == default_k
    assert k_policy_from_parameters(params) == policy_for(recipe.speculative)


def test_fast_logits_sets_participant_ids(tiny_pair, tmp_path, engines):
    recipe = make_recipe(tiny_pair, speculative={"max_draft_len": 4}, triton={"fast_logits": True})
    deploy(recipe, "tensorrtllm", tmp_path / "r", engine_dirs=engines)
    target = _params(parse_model_config((tmp_path / "r/tensorrt_llm/config.pbtxt").read_text(), "t"))
    draft = _params(parse_model_config((tmp_path / "r/tensorrt_llm_draft/config.pbtxt").read_text(), "d"))
    assert (draft["participant_ids"], target["participant_ids"]) == ("1", "2")
    assert target["speculative_decoding_fast_logits"] == draft["speculative_decoding_fast_logits"] == "1"


def test_engine_models_declare_every_output_the_backend_writes_for_perf_metrics(tiny_pair, tmp_path, engines):
    """The C++ backend writes these for a request with return_perf_metrics whatever outputs it asked for, and Triton
    fails a response with an undeclared output (model_instance_state.cc fillTritonResponse)."""
    deploy(
        make_recipe(tiny_pair, speculative={"max_draft_len": 4}),
        "tensorrtllm",
        tmp_path / "r",
        engine_dirs=engines,
    )
    written = {
        "kv_cache_alloc_new_blocks": "TYPE_INT32",
        "kv_cache_reused_blocks": "TYPE_INT32",
        "kv_cache_alloc_total_blocks": "TYPE_INT32",
        "arrival_time_ns": "TYPE_INT64",
        "first_scheduled_time_ns": "TYPE_INT64",
        "first_token_time_ns": "TYPE_INT64",
        "last_token_time_ns": "TYPE_INT64",
        "acceptance_rate": "TYPE_FP32",
        "total_accepted_draft_tokens": "TYPE_INT32",
        "total_draft_tokens": "TYPE_INT32",
    }
    for model in (names.TARGET_MODEL, names.DRAFT_MODEL):
        config = parse_model_config((tmp_path / "r" / model / "config.pbtxt").read_text(), model)
        assert "return_perf_metrics" in {t.name for t in config.input}
        declared = {t.name: model_config_pb2.DataType.Name(t.data_type) for t in config.output}
        assert {k: declared.get(k) for k in written} == written


def test_tensorrtllm_refuses_engines_that_do_not_fit(tiny_pair, tmp_path):
    recipe = make_recipe(tiny_pair, speculative={"max_draft_len": 4})
    bad = {
        "target": fake_engine(tmp_path / "e" / "target", max_draft_len=0),
        "draft": fake_engine(tmp_path / "e" / "draft", max_draft_len=0),
    }
    with pytest.raises(CheckFailed, match="draft_tokens_external"):
        deploy(recipe, "tensorrtllm", tmp_path / "r", engine_dirs=bad)
    assert not (tmp_path / "r").exists()
    short = {"target": fake_engine(tmp_path / "f" / "target", max_draft_len=2), "draft": bad["draft"]}
    with pytest.raises(CheckFailed, match="max_draft_len 2 < max_draft_len 4 asked for"):
        deploy(recipe, "tensorrtllm", tmp_path / "r", engine_dirs=short)


def test_tensorrtllm_refuses_engines_whose_logits_or_token_budget_the_repository_cannot_serve(
    tiny_pair, tmp_path
):
    recipe = make_recipe(
        tiny_pair,
        speculative={"max_draft_len": 4, "use_draft_logits": True},
        limits={"max_input_len": 100, "max_seq_len": 300},
    )

    def pair(root, **draft):
        return {
            "target": fake_engine(root / "target", max_draft_len=4, gather=True),
            "draft": fake_engine(root / "draft", max_draft_len=0, gather=True, **draft),
        }

    # modelopt's float16 logits: the backend would refuse every draft response against the repository's FP32
    with pytest.raises(
        CheckFailed, match="draft engine returns float16 logits where the repository declares float32"
    ):
        deploy(
            recipe, "tensorrtllm", tmp_path / "r", engine_dirs=pair(tmp_path / "a", logits_dtype="float16")
        )
    # without chunked context the runtime takes no sequence longer than max_num_tokens
    with pytest.raises(CheckFailed, match="draft engine max_num_tokens 200 < limits.max_seq_len 300 - 1"):
        deploy(recipe, "tensorrtllm", tmp_path / "r", engine_dirs=pair(tmp_path / "b", max_num_tokens=200))
    assert not (tmp_path / "r").exists()
    deploy(recipe, "tensorrtllm", tmp_path / "r", engine_dirs=pair(tmp_path / "c", max_num_tokens=299))


def test_cross_model_check_catches_a_dtype_mismatch_and_a_missing_model(tiny_pair, engines):
    """On the orchestrator's layout: the orchestrator over the TensorRT-LLM backend's engine models."""
    recipe = make_recipe(tiny_pair, speculative={"max_draft_len": 4})
    rendered = render_models(plan_models(recipe, "tensorrtllm", engines))
    configs = {name: cfg for name, (_, cfg) in rendered.items()}
    text = rendered[names.TARGET_MODEL][0].replace(
        'name: "request_output_len" data_type: TYPE_INT32', 'name: "request_output_len" data_type: TYPE_INT64'
    )
    broken = dict(configs, **{names.TARGET_MODEL: parse_model_config(text, "t")})
    with pytest.raises(
        CheckFailed,
        match="sends 'request_output_len' as TYPE_INT32 to tensorrt_llm, which expects TYPE_INT64",
    ):
        check_repository(broken)
    missing = {k: v for k, v in configs.items() if k != names.DRAFT_MODEL}
    with pytest.raises(CheckFailed, match="calls model 'tensorrt_llm_draft'"):
        check_repository(missing)


def test_the_ensemble_passes_the_entry_models_interface_through_under_the_same_names(tiny_pair, engines):
    """Upstream's `ensemble` name (its clients' default) over either runtime's entry model: one step, every input
    and output of the entry model under its own name, declared alike (dtype, dims, optional)."""
    recipe = make_recipe(tiny_pair, speculative={"max_draft_len": 4})
    for runtime in ("torch", "tensorrtllm"):
        configs = render_models(plan_models(recipe, runtime, engines if runtime == "tensorrtllm" else None))
        entry, ensemble = configs[names.ENTRY_POINT][1], configs[names.ENSEMBLE][1]
        assert ensemble.platform == "ensemble" and ensemble.max_batch_size == entry.max_batch_size
        assert list(ensemble.input) == list(entry.input) and list(ensemble.output) == list(entry.output)
        (step,) = ensemble.ensemble_scheduling.step
        assert step.model_name == names.ENTRY_POINT
        assert dict(step.input_map) == {t.name: t.name for t in entry.input}
        assert dict(step.output_map) == {t.name: t.name for t in entry.output}
    # the written text is what was checked
    text = configs[names.ENSEMBLE][0]
    assert parse_model_config(text, names.ENSEMBLE) == configs[names.ENSEMBLE][1]
    elsewhere = text.replace('model_name: "tensorrt_llm_bls"', 'model_name: "tensorrt_llm_blss"')
    broken = {name: config for name, (_, config) in configs.items()}
    broken[names.ENSEMBLE] = parse_model_config(elsewhere, names.ENSEMBLE)
    with pytest.raises(CheckFailed, match="ensemble ensemble has a step on model 'tensorrt_llm_blss'"):
        check_repository(broken)


def test_the_harness_engine_models_have_the_backends_tensors(tiny_pair, engines):
    """The test harness's stand-in engine models (tests/harness) take and give the TensorRT-LLM backend's
    tensors, declared alike, so the orchestrator served over them is served as over the backend."""
    recipe = make_recipe(tiny_pair, speculative={"max_draft_len": 4})
    trt_cfg = render_models(plan_models(recipe, "tensorrtllm", engines))[names.TARGET_MODEL][1]
    stand_in = engine_config(recipe, "target")[1]
    for tensor in names.ENGINE_INPUTS:
        a = next(t for t in stand_in.input if t.name == tensor)
        b = next(t for t in trt_cfg.input if t.name == tensor)
        assert (a.data_type, list(a.dims), a.optional) == (b.data_type, list(b.dims), b.optional), tensor
    for tensor in names.ENGINE_OUTPUTS:
        a = next(t for t in stand_in.output if t.name == tensor)
        b = next(t for t in trt_cfg.output if t.name == tensor)
        assert (a.data_type, list(a.dims)) == (b.data_type, list(b.dims)), tensor


def test_serve_offers_requests_in_upstreams_names_for_an_llmapi_repository():
    """Unknown JSON fields become request parameters the LLM-API model never reads: max_tokens would not be
    honoured and generate_stream would not stream."""
    import json
    import re

    from trtspec.triton_repo import llmapi
    from trtspec.triton_repo.serve import sample_requests

    offered = sample_requests(Ports(8000, 8001, 8002), "tensorrt_llm", interface="llmapi")
    bodies = [json.loads(m) for line in offered for m in re.findall(r"-d '(.*)'", line)]
    assert len(bodies) == 2 and all(set(b) <= set(llmapi.LLMAPI_INPUTS) for b in bodies)
    assert bodies[0]["sampling_param_max_tokens"] == 32 and bodies[1]["streaming"] is True
