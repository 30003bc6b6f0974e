"""A Triton endpoint as a system under test (systems.py's protocol) over ``TritonClient`` (triton_client.py).

trtspec repositories return the generated ``output_ids``, which ``TritonSystem`` compares exactly; for an entry
model that returns text only it tokenises ``text_output`` with the target's tokenizer (``Generation.ids_from_text``)
and validate maps the reference through text the same way.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from trtspec.chat import check_text_input
from trtspec.core.errors import RequestError
from trtspec.core.lookup import PROPOSERS
from trtspec.core.metrics import AcceptanceStats
from trtspec.triton_repo.interface import ADAPTIVE
from trtspec.validate.systems import Generation, Request
from trtspec.validate.triton_client import EndpointResponse, TritonClient

# Whose K limit a run is held to (inputs.check_num_draft_tokens names it)
SERVED_LIMIT = "the server's max_draft_len"
RECIPE_LIMIT = "the recipe's speculative.max_draft_len"


class TritonSystem:
    """A Triton endpoint as a system under test: each request of a batch is sent concurrently (one thread each).

    What a run depends on is read from the server where it publishes it (``TritonClient.served_config``): the
    entry model's max_draft_len, proposer and num_draft_tokens parameters and whether it is decoupled. Where it
    does not, the recipe's values (``max_draft_len``, ``proposer``, ``decoupled``) stand in and ``notes`` says so.
    """

    def __init__(
        self,
        url: str,
        tokenizer,
        *,
        protocol: str = "auto",
        model: str | None = None,
        max_draft_len: int = 8,
        max_batch_size: int = 8,
        proposer: str = "draft",
        decoupled: bool = True,
        llmapi_max_draft_len: int | None = None,
    ):
        self.client = TritonClient(url, protocol, model)
        self.client.check_ready()
        self.tokenizer, self.max_batch_size = tokenizer, max_batch_size
        self._checked_chats: set[str] = set()  # chat texts that passed check_text_input
        # One pool per number of requests in flight, kept for the system's life: its threads keep their gRPC
        # connections (TritonClient's), so no group's timing includes connecting.
        self._pools: dict[int, ThreadPoolExecutor] = {}
        self._unreported = False  # an llmapi response reported no draft tokens (see notes)
        self._notes: list[str] = []
        self.name = f"Triton {self.client.model} at {self.client.address} ({self.client.protocol})"
        served = self.client.served_config()
        # what its target computes in: the torch runtime's entry model publishes it (target_dtype); where a
        # server does not say, validate takes the recipe's deployment's
        self.dtype: str | None = (served.parameters or {}).get("target_dtype") or None
        self.stream = self._streaming(served.decoupled, decoupled)
        if self.client.interface == "llmapi":
            self._upstream_settings(llmapi_max_draft_len or max_draft_len, max_draft_len, proposer)
        else:
            self._served_settings(served.parameters, max_draft_len, proposer)

    def _served_settings(self, parameters: dict[str, str] | None, max_draft_len: int, proposer: str) -> None:
        """K limit, proposer and default K from the entry model's parameters (the recipe's where it has none)."""
        served = parameters or {}
        limit, served_proposer = served.get("max_draft_len", ""), served.get("proposer")
        self.fixed_k = None
        self.max_draft_len = int(limit) if limit.isdigit() else max_draft_len
        self.max_draft_len_source = SERVED_LIMIT if limit.isdigit() else RECIPE_LIMIT
        self.proposer = served_proposer if served_proposer in PROPOSERS else proposer
        # A request without K gets the repository's default: adaptive K where the entry model says so, else the
        # K it pins (default_k; None where unknown or adaptive).
        default = served.get("num_draft_tokens", "")
        self.adaptive = None if parameters is None else default == ADAPTIVE
        self.default_k = int(default) if default.isdigit() else None
        if parameters is None:
            self._notes.append(
                f"{self.name}: its model configs could not be read, so its max_draft_len and proposer were taken "
                f"from the recipe ({max_draft_len}, {proposer}) and whether a request without K gets adaptive K "
                "is unknown."
            )
            return
        published = {"max_draft_len": limit.isdigit(), "proposer": served_proposer in PROPOSERS}
        missing = [name for name, known in published.items() if not known]
        if missing:
            self._notes.append(
                f"{self.name} publishes no {' or '.join(missing)} parameter: the recipe's was taken "
                f"(max_draft_len {self.max_draft_len}, proposer {self.proposer})."
            )

    def _upstream_settings(self, k: int, max_draft_len: int, proposer: str) -> None:
        """Upstream's LLM-API model drafts its model.yaml's max_draft_len (``k``) every round and takes no
        per-request K or proposer; it publishes neither, so they are what trtspec deploy writes for the recipe."""
        self.fixed_k, self.max_draft_len, self.default_k = k, max_draft_len, k
        self.max_draft_len_source = RECIPE_LIMIT
        self.proposer, self.adaptive = proposer, False
        self._notes.append(
            f"{self.name} publishes neither its K nor its proposer (upstream's LLM-API model reads them from "
            f"model.yaml): K={k} and proposer {proposer} are those trtspec deploy writes for this recipe."
        )

    def _streaming(self, decoupled: bool | None, recipe_decoupled: bool) -> bool:
        """Stream where the model is decoupled (a model that is not refuses stream=true); the recipe's
        triton.decoupled where the server does not say."""
        if decoupled is None:
            self._notes.append(
                f"{self.name}: whether it is decoupled could not be read; the recipe's triton.decoupled "
                f"({str(recipe_decoupled).lower()}) was taken."
            )
            decoupled = recipe_decoupled
        if not decoupled:
            self._notes.append(
                f"{self.name} is not decoupled: it answers each request whole, so time to first token and "
                "inter-token latency are unknown (-)."
            )
        return decoupled

    @property
    def notes(self) -> list[str]:
        """What the reports should say about this system: where a setting came from the recipe, what is
        unknown."""
        if not self._unreported:
            return list(self._notes)
        return [
            *self._notes,
            f"{self.name} reported no draft tokens (total_draft_tokens 0) for requests that draft K={self.fixed_k}: "
            "TensorRT-LLM 1.2.x's PyTorch flow returns its per-request speculative-decoding counters zeroed "
            "(fixed upstream in NVIDIA/TensorRT-LLM#17082), so acceptance is unknown here, not zero.",
        ]

    def generate(self, requests: list[Request], params, in_flight: int | None = None) -> list[Generation]:
        """Each request on a thread of its own (``in_flight``: that many threads, each sending its next request as
        its last one finishes: a steady load); a request's times count from its own send."""
        sampling = (
            {}
            if params.greedy
            else {
                "temperature": params.temperature,
                "top_k": params.top_k,
                "top_p": params.top_p,
                "seed": params.seed,
            }
        )
        # no K: upstream's LLM-API model's own; else none is sent, so the repository's default applies (adaptive
        # K where deploy wrote "adaptive")
        k = self.fixed_k if params.num_draft_tokens is None else params.num_draft_tokens
        if self.fixed_k is not None and k != self.fixed_k:
            raise RequestError(
                f"{self.name}: upstream's LLM-API model drafts max_draft_len {self.fixed_k} tokens per round "
                f"(model.yaml) and takes no per-request K, so K={k} cannot be measured; use K={self.fixed_k}"
            )
        if self.fixed_k is not None and params.proposer is not None:
            raise RequestError(
                f"{self.name}: upstream's LLM-API model proposes as its model.yaml says and takes no per-request "
                f"proposer, so proposer {params.proposer!r} cannot be measured; drop --proposer"
            )
        if params.proposer is not None:  # none: the repository's speculative.proposer
            sampling["proposer"] = params.proposer

        for request in requests:
            # Chats were rendered client-side (trtspec/chat.py); the server tokenises text_input its own way.
            if request.chat and request.text not in self._checked_chats:
                check_text_input(self.tokenizer, request.text, request.token_ids, "a chat prompt")
                self._checked_chats.add(request.text)

        def one(request: Request) -> Generation:
            budget = request.max_new_tokens or params.max_new_tokens
            response = self.client.generate(request.text, budget, k, self.stream, **sampling)
            return self._generation(response, k)

        workers = in_flight or len(requests)
        if workers not in self._pools:
            self._pools[workers] = ThreadPoolExecutor(workers, thread_name_prefix=f"triton-{workers}")
        return list(self._pools[workers].map(one, requests))

    def _generation(self, response: EndpointResponse, k: int | None) -> Generation:
        # Exact ids when the entry model returns output_ids (trtspec repositories do); else tokenise the text.
        from_text = response.token_ids is None
        ids = (
            self.tokenizer(response.text, add_special_tokens=False).input_ids
            if from_text
            else response.token_ids
        )
        drafted = int(response.metrics.get("total_draft_tokens", 0))
        # Every request to upstream's LLM-API model drafts: none reported is a counter it did not fill (notes).
        if self.fixed_k is not None and not drafted and len(ids) > 1:  # a second token came from a round
            self._unreported = True
        stats = AcceptanceStats(
            max_draft_len=self.max_draft_len if k is None else k,
            drafted=drafted,
            accepted=int(response.metrics.get("total_accepted_draft_tokens", 0)),
            generated_tokens=len(ids),
            elapsed_s=response.elapsed_s,
            # a whole answer's arrival is not its first token's
            time_to_first_token_s=response.pieces[0][0] if response.pieces and self.stream else None,
            totals_only=True,  # a response carries totals: no rounds
        )
        stats.by_proposer = by_proposer(response.metrics, stats.drafted, stats.accepted)
        return Generation(
            ids,
            response.text,
            stats,
            response.elapsed_s,
            stats.time_to_first_token_s,
            self._chunks(response),
            ids_from_text=from_text,
        )

    def _chunks(self, response: EndpointResponse) -> list[tuple[float, int]]:
        """(arrival, tokens) per piece: from output_ids, else by tokenising the growing text (sums to the total)."""
        if response.id_pieces is not None:
            return [(arrival, len(ids)) for arrival, ids in response.id_pieces]
        chunks, text, before = [], "", 0
        for arrival, piece in response.pieces:
            text += piece
            count = len(self.tokenizer(text, add_special_tokens=False).input_ids)
            chunks.append((arrival, max(count - before, 0)))
            before = count
        return chunks

    def close(self) -> None:
        """Give up what is in flight (a run stopping on Ctrl-C or a failed request would otherwise wait for the
        other requests' whole answers; gRPC ones are cancelled on the server, an HTTP read ends when its answer
        does), then end the request threads."""
        self.client.stop()
        for pool in self._pools.values():
            pool.shutdown(cancel_futures=True)
        self._pools.clear()


def by_proposer(metrics: dict, drafted: int, accepted: int) -> dict[str, list[int]]:
    """AcceptanceStats.by_proposer from a response's metrics: lookup's part of the totals, the draft model's the
    rest (rounds unknown: 0). A server that reports no lookup part counts every drafted token as the draft's."""
    ngram = [0, int(metrics.get("ngram_draft_tokens", 0)), int(metrics.get("ngram_accepted_draft_tokens", 0))]
    draft = [0, drafted - ngram[1], accepted - ngram[2]]
    return {name: cell for name, cell in (("draft", draft), ("ngram", ngram)) if cell[1] > 0}
