"""A Triton endpoint as a system under test (systems.py's protocol) over ``TritonClient`` (triton_client.py).

trtspec repositories return the generated ``output_ids``, which ``TritonSystem`` compares exactly; for an entry
model that returns text only it tokenises ``text_output`` with the target's tokenizer (``Generation.ids_from_text``)
and validate maps the reference through text the same way.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from trtspec.chat import check_text_input
from trtspec.core.errors import RequestError
from trtspec.core.metrics import AcceptanceStats
from trtspec.triton_repo.interface import ADAPTIVE
from trtspec.validate.systems import Generation, Request
from trtspec.validate.triton_client import EndpointResponse, TritonClient


class TritonSystem:
    """A Triton endpoint as a system under test: each request of a batch is sent concurrently (one thread each)."""

    def __init__(
        self,
        url: str,
        tokenizer,
        *,
        protocol: str = "auto",
        model: str | None = None,
        max_draft_len: int = 8,
        max_batch_size: int = 8,
        stream: bool = True,
        llmapi_max_draft_len: int | None = None,
    ):
        self.client = TritonClient(url, protocol, model)
        self.client.check_ready()
        self.tokenizer, self.stream = tokenizer, stream
        self._checked_chats: set[str] = set()  # chat texts that passed check_text_input
        self.max_draft_len, self.max_batch_size = max_draft_len, max_batch_size
        self.name = f"Triton {self.client.model} at {self.client.address} ({self.client.protocol})"
        # upstream's LLM-API model drafts its model.yaml's max_draft_len (llmapi_max_draft_len: what trtspec wrote
        # there) and takes no per-request K
        llmapi_k = llmapi_max_draft_len or max_draft_len
        self.fixed_k = llmapi_k if self.client.interface == "llmapi" else None
        # A request without K (or proposer) gets the repository's default: adaptive K where the entry model says so.
        parameters = self.client.model_parameters() if not self.fixed_k else {}
        self.adaptive = parameters.get("num_draft_tokens") == ADAPTIVE
        self.proposer = parameters.get("proposer") or "draft"

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

        with ThreadPoolExecutor(max_workers=in_flight or len(requests)) as pool:
            return list(pool.map(one, requests))

    def _generation(self, response: EndpointResponse, k: int | None) -> Generation:
        # Exact ids when the entry model returns output_ids (trtspec repositories do); else tokenise the text.
        from_text = response.token_ids is None
        ids = (
            self.tokenizer(response.text, add_special_tokens=False).input_ids
            if from_text
            else response.token_ids
        )
        stats = AcceptanceStats(
            max_draft_len=self.max_draft_len if k is None else k,
            drafted=int(response.metrics.get("total_draft_tokens", 0)),
            accepted=int(response.metrics.get("total_accepted_draft_tokens", 0)),
            generated_tokens=len(ids),
            elapsed_s=response.elapsed_s,
            time_to_first_token_s=response.pieces[0][0] if response.pieces else None,
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
        pass


def by_proposer(metrics: dict, drafted: int, accepted: int) -> dict[str, list[int]]:
    """AcceptanceStats.by_proposer from a response's metrics: lookup's part of the totals, the draft model's the
    rest (rounds unknown: 0). A server that reports no lookup part counts every drafted token as the draft's."""
    ngram = [0, int(metrics.get("ngram_draft_tokens", 0)), int(metrics.get("ngram_accepted_draft_tokens", 0))]
    draft = [0, drafted - ngram[1], accepted - ngram[2]]
    return {name: cell for name, cell in (("draft", draft), ("ngram", ngram)) if cell[1] > 0}
