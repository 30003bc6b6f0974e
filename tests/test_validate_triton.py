"""validate and bench against a real tritonserver (CPU, torch runtime) on the tiny pair: one server per module."""

from __future__ import annotations

import json

import pytest
from test_validate import PlantedMismatch, write_recipe
from triton_server import running_server

from trtspec.cli import cli
from trtspec.core.errors import ServerError

pytestmark = [pytest.mark.server, pytest.mark.slow]


@pytest.fixture(scope="module")
def served(tiny_pair, tmp_path_factory):
    from trtspec.recipe import load_recipe
    from trtspec.triton_repo.deploy import deploy

    target, draft = tiny_pair
    root = tmp_path_factory.mktemp("served")
    recipe_path = write_recipe(root / "tiny.yaml", target, draft)
    deploy(load_recipe(recipe_path), "torch", root / "repo")
    with running_server(root / "repo", root / "server.log") as server:
        yield recipe_path, server


def test_validate_over_grpc_and_http(runner, served, tmp_path):
    recipe, server = served
    # gRPC without a K (the server's adaptive default); HTTP with a pinned K, which must draft. Adaptive K may
    # rightly draft nothing here: its measured cost of the tiny draft is about the target's, timing-dependent.
    for url, k_options in (
        (server.ports.grpc_url, []),
        (f"http://{server.ports.http_url}", ["--num-draft-tokens", "2"]),
    ):
        report = tmp_path / "report.md"
        result = runner.invoke(
            cli,
            [
                "validate",
                str(recipe),
                "--url",
                url,
                "--limit",
                "2",
                "--max-tokens",
                "8",
                "--json",
                "--report",
                str(report),
                "--min-exact-match",
                "1",
                *k_options,
            ],
        )
        assert result.exit_code == 0, result.output
        payload = json.loads(result.stdout)
        assert (
            payload["overall"]["exact_match_rate"] == 1.0 and payload["overall"]["control_match_rate"] == 1.0
        )
        assert ("grpc" if "http" not in url else "http") in payload["system"]
        stats = payload["stats"]
        assert (
            0 <= stats["accepted"] <= stats["drafted"]
            and payload["prompts"][0]["mean_accepted_length"] is None
        )
        if k_options:
            assert payload["num_draft_tokens"] == 2 and stats["drafted"] > 0
        else:  # the recipe pins no K: validate sends none, and the repository deploy wrote serves adaptive K
            assert payload["num_draft_tokens"] == "adaptive"
        # trtspec repositories return output_ids: compared exactly, so no note on re-tokenising text_output.
        assert "text_output" not in report.read_text()


def test_planted_mismatch_over_triton(served):
    from trtspec.recipe import load_recipe
    from trtspec.validate.inputs import SystemOptions, open_reference, open_system
    from trtspec.validate.prompts import load_prompts
    from trtspec.validate.validation import Thresholds, run_validation

    recipe_path, server = served
    recipe = load_recipe(recipe_path)
    reference = open_reference(recipe, SystemOptions())
    system = open_system(recipe, SystemOptions(url=server.ports.grpc_url), reference.tokenizer)
    prompts = load_prompts(limit=2)
    planted = PlantedMismatch(system, prompts[0].text, position=2)
    result = run_validation(
        planted, reference, prompts, max_new_tokens=8, thresholds=Thresholds(min_exact_match=1.0)
    )
    assert (
        result.outcomes[0].vs_reference.first_divergence == 2 and result.outcomes[1].vs_reference.exact_match
    )
    assert result.failures()[0].startswith("exact-match rate vs the HF reference 0.500")


def test_bench_over_grpc_small_sweep(runner, served, tmp_path):
    recipe, server = served
    out_dir = tmp_path / "bench"
    result = runner.invoke(
        cli,
        [
            "bench",
            str(recipe),
            "--url",
            server.ports.grpc_url,
            "--limit",
            "2",
            "--max-tokens",
            "8",
            "--num-draft-tokens",
            "2",
            "--concurrency",
            "1,2",
            "--draft-cost-ratio",
            "0.2",
            "--out",
            str(out_dir),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    saved = json.loads((out_dir / "bench.json").read_text())
    # the entry model's num_draft_tokens parameter is "adaptive" (the recipe pins no K): adaptive points too
    assert {(p["num_draft_tokens"], p["concurrency"]) for p in saved["points"]} == {
        (0, 1),
        (2, 1),
        (None, 1),
        (0, 2),
        (2, 2),
        (None, 2),
    }
    assert [row["concurrency"] for row in saved["adaptive_sweep"]] == [1, 2]
    # a server reports draft totals, not target forwards: its mean K is unknown, not 0
    assert all(row["adaptive_mean_num_draft_tokens"] is None for row in saved["adaptive_sweep"])
    for point in saved["points"]:
        assert point["tokens_per_s"] > 0 and point["ttft_p50_s"] is not None
    assert all(p["analytic_bound"] > 0 for p in saved["points"] if p["num_draft_tokens"])
    assert (out_dir / "latency_concurrency.png").stat().st_size > 1000


def test_unreachable_url_is_a_clear_error(runner, served):
    from trtspec.triton_repo.server import free_ports
    from trtspec.validate.triton_client import TritonClient

    (port,) = free_ports(1)
    with pytest.raises(ServerError, match="cannot reach Triton"):
        TritonClient(f"http://127.0.0.1:{port}").generate("def", 2)
    recipe, _ = served
    result = runner.invoke(
        cli, ["validate", str(recipe), "--url", f"127.0.0.1:{port}", "--limit", "1", "--max-tokens", "2"]
    )
    assert result.exit_code == 2 and "cannot reach Triton" in result.output


def test_validate_chat_prompts_over_grpc(runner, served, tiny_pair, tmp_path):
    """Chats are rendered client-side into text_input (the server takes raw text): the server's ids are the
    template's, compared exactly with the reference on the same ids."""
    import shutil

    from test_chat import CHAT_LINE, CHAT_TEMPLATE

    _, server = served
    target = shutil.copytree(tiny_pair[0], tmp_path / "target")  # the served target, with a chat template
    config = json.loads((target / "tokenizer_config.json").read_text())
    (target / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": CHAT_TEMPLATE}))
    recipe = write_recipe(tmp_path / "chat.yaml", target, tiny_pair[1])
    prompts = tmp_path / "chats.jsonl"
    prompts.write_text(json.dumps(CHAT_LINE) + "\n")
    args = ["validate", str(recipe), "--url", server.ports.grpc_url, "--prompts", str(prompts), "--chat"]
    # a pinned K: adaptive K may judge the tiny pair (draft about as costly as the target) not worth drafting
    options = ["--max-tokens", "8", "--num-draft-tokens", "4", "--json", "--min-exact-match", "1"]
    result = runner.invoke(cli, [*args, *options])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["sets"]["chat"]["exact_match_rate"] == 1.0 and payload["stats"]["drafted"] > 0


def test_the_entry_models_parameters_over_grpc_and_http(served):
    """What bench reads to know a request without K gets adaptive K (deploy wrote the recipe's unpinned K), its K
    range and whether to stream; asked of upstream's `ensemble` name, the same, from the step it runs."""
    from trtspec.validate.triton_client import TritonClient

    _, server = served
    for url in (server.ports.grpc_url, f"http://{server.ports.http_url}"):
        for model in ("tensorrt_llm_bls", "ensemble"):
            config = TritonClient(url, model=model).served_config()
            params = config.parameters
            assert params["num_draft_tokens"] == "adaptive" and params["max_draft_len"].isdigit(), (
                url,
                model,
            )
            assert config.decoupled is True and config.source == "tensorrt_llm_bls", (url, model)


def test_a_grpc_client_thread_keeps_its_connection_and_replaces_it_after_an_error(served):
    from trtspec.validate.triton_client import TritonClient

    _, server = served
    client = TritonClient(server.ports.grpc_url, "grpc")
    first = client.generate("def f(x):", 4, 1)
    connection = client._connections.client
    second = client.generate("def f(x):", 4, 1)
    assert client._connections.client is connection  # the second request used the first one's connection
    assert first.text == second.text and first.token_ids == second.token_ids
    with pytest.raises(ServerError, match="max_tokens"):
        client.generate("def f(x):", 0, 1)  # refused by the server
    assert client._connections.client is None  # the next request connects afresh
    assert client.generate("def f(x):", 4, 1).text == first.text


def test_a_server_that_stops_answering_is_one_line(served):
    """A request whose next response does not come within the client's wait (a stuck request): one line naming
    the server and the wait, over gRPC's stream (a real server, a wait shorter than any response) and over HTTP
    (a socket that takes the request and never answers), not a queue.Empty or TimeoutError traceback."""
    import socket

    from trtspec.validate.triton_client import TritonClient

    _, server = served
    impatient = TritonClient(server.ports.grpc_url, "grpc", timeout_s=1e-4)
    with pytest.raises(ServerError, match=r"sent nothing for 0\.0001 s; check the server's log for a stuck"):
        impatient.generate("def f(x):", 64, 1)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        client = TritonClient(url, model="tensorrt_llm_bls", interface="trtspec", timeout_s=0.5)
        with pytest.raises(ServerError, match=rf"^Triton at {url} sent nothing for 0\.5 s; "):
            client.generate("def f(x):", 2)


@pytest.mark.one_stack  # how a non-decoupled repository is served and asked: the same on either transformers
def test_validate_and_bench_a_repository_that_is_not_decoupled(runner, tiny_pair, tmp_path):
    """triton.decoupled false: the entry model refuses stream=true, so validate and bench ask for whole answers,
    and bench reports time to first token and inter-token latency as unknown. The server's setting counts: the
    recipe given to validate and bench says decoupled (the default)."""
    from trtspec.recipe import load_recipe
    from trtspec.triton_repo.deploy import deploy

    deployed = write_recipe(tmp_path / "deployed.yaml", *tiny_pair)
    deployed.write_text(deployed.read_text() + "triton: {decoupled: false}\n")
    deploy(load_recipe(deployed), "torch", tmp_path / "repo")
    recipe = write_recipe(tmp_path / "tiny.yaml", *tiny_pair)
    common = ["--limit", "1", "--max-tokens", "8", "--num-draft-tokens", "2", "--json"]
    with running_server(tmp_path / "repo", tmp_path / "server.log") as server:
        checked = runner.invoke(
            cli, ["validate", str(recipe), "--url", server.ports.grpc_url, *common, "--min-exact-match", "1"]
        )
        out = tmp_path / "bench"
        args = ["bench", str(recipe), "--url", server.ports.grpc_url, *common, "--concurrency", "1"]
        benched = runner.invoke(cli, [*args, "--draft-cost-ratio", "0.2", "--out", str(out)])
    assert checked.exit_code == 0, checked.output
    payload = json.loads(checked.stdout)
    assert payload["overall"]["exact_match_rate"] == 1.0 and payload["stats"]["drafted"] > 0
    assert any("is not decoupled" in note for note in payload["notes"])
    assert benched.exit_code == 0, benched.output
    points = json.loads((out / "bench.json").read_text())["points"]
    assert points and all(p["ttft_p50_s"] is None and p["itl_p50_s"] is None for p in points)
    assert all(p["tokens_per_s"] > 0 for p in points)
