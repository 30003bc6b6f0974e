"""Stand-in of tensorrt_llm/runtime/model_runner_cpp.py ``ModelRunnerCpp`` (TensorRT-LLM 1.2.x signatures).

``from_dir`` and ``generate`` take exactly the real parameters (NVIDIA/TensorRT-LLM, read at commit 0383291) and
check what the real ones check (batch / input / sequence limits, beams, and the executor's "Number of draft
tokens (N) is larger than maximum number of draft tokens (M)"). Instead of a TensorRT engine the runner runs the
Hugging Face model named by the engine config.json's extra key ``fake_hf_model_dir`` (top level or in
pretrained_config, where the fake build carries it from the checkpoint config; only this stand-in reads it), on CPU in float32, one request at a time without a KV cache: the models are tiny.

Outputs follow the real non-streaming ``return_dict=True`` layout: ``output_ids`` [B, 1, max_seq_len] int32 with
the prompt and padded with end_id, ``sequence_lengths`` [B, 1] (prompt included), ``generation_logits`` when the
engine gathers them or ``output_generation_logits``: a tensor [B, 1, max_out_len, V] for plain requests, a list
of [1, n, V] per response for draft-target requests. The end token is left out, as TensorRT-LLM's sampling and
acceptance kernels count it in no sequence length ("Seq len should always contain only tokens to be outputted");
a completed stop word is kept.

Draft-target verification (``draft_tokens_list``), as the executor's ExternalDraftTokensConfig: one target forward
over prefix + draft tokens gives K+1 target distributions; without ``draft_logits_list`` (or when greedy) the
target picks its own token at each position (argmax when greedy, a sample otherwise) and accepts the longest
prefix of draft tokens equal to them; with ``draft_logits_list`` it accepts draft token x with probability
min(1, target_probs[x] / draft_probs[x]) and samples the recovered token from the residual. Either way the
request emits accepted + 1 tokens and ends (it is one verification step).

Test hooks (not in the real class): ``ModelRunnerCpp.calls`` records (engine_dir, generate kwargs) per call.
"""

import json
import os

import torch

_MODELS = {}


def _load_model(path):
    if path not in _MODELS:
        from transformers import AutoModelForCausalLM

        _MODELS[path] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return _MODELS[path]


class _Executor:
    """The part of tensorrt_llm.bindings.executor.Executor the runner's users touch."""

    def __init__(self):
        self.is_shut_down = False

    def can_enqueue_requests(self):
        return not self.is_shut_down

    def shutdown(self):
        self.is_shut_down = True


class ModelRunnerCpp:
    calls = []

    def __init__(self, engine_dir, config, max_batch_size, max_input_len, max_seq_len, max_beam_width):
        self.engine_dir, self.config = engine_dir, config
        self.session = _Executor()  # the real class keeps its trtllm.Executor here
        self.max_batch_size, self.max_input_len = max_batch_size, max_input_len
        self.max_seq_len, self.max_beam_width = max_seq_len, max_beam_width
        build = config["build_config"]
        self.max_draft_len = int(build.get("max_draft_len") or 0)
        self._gather_generation_logits = bool(build.get("gather_generation_logits"))
        # Written by a test at the top level, or carried from the checkpoint config through the fake build.
        hf_dir = config.get("fake_hf_model_dir") or config["pretrained_config"]["fake_hf_model_dir"]
        self.model = _load_model(hf_dir)

    @classmethod
    def from_dir(
        cls,
        engine_dir,
        *,
        lora_dir=None,
        rank=0,
        max_batch_size=None,
        max_input_len=None,
        max_output_len=None,
        max_beam_width=None,
        max_attention_window_size=None,
        sink_token_length=None,
        kv_cache_free_gpu_memory_fraction=None,
        cross_kv_cache_fraction=None,
        medusa_choices=None,
        eagle_choices=None,
        eagle_posterior_threshold=None,
        eagle_use_dynamic_tree=False,
        eagle_dynamic_tree_max_top_k=None,
        lookahead_config=None,
        debug_mode=False,
        lora_ckpt_source="hf",
        use_gpu_direct_storage=False,
        gpu_weights_percent=1,
        max_tokens_in_paged_kv_cache=None,
        kv_cache_enable_block_reuse=False,
        enable_chunked_context=False,
        is_enc_dec=False,
        multi_block_mode=True,
        enable_context_fmha_fp32_acc=None,
        cuda_graph_mode=None,
        logits_processor_map=None,
        device_ids=None,
        is_orchestrator_mode=False,
        use_runtime_defaults=True,
        gather_generation_logits=False,
        use_variable_beam_width_search=False,
        mm_embedding_offloading=False,
        fail_fast_on_attention_window_too_large=False,
    ):
        with open(os.path.join(engine_dir, "config.json")) as f:
            config = json.load(f)
        build = config["build_config"]
        assert rank == 0
        if max_batch_size is None:
            max_batch_size = build["max_batch_size"]
        else:
            assert max_batch_size <= build["max_batch_size"]
        if max_input_len is None:
            max_input_len = build["max_input_len"]
        if max_output_len is None:
            max_seq_len = build["max_seq_len"]
        else:
            max_seq_len = max_input_len + max_output_len
            assert max_seq_len <= build["max_seq_len"]
        if max_beam_width is None:
            max_beam_width = build["max_beam_width"]
        else:
            assert max_beam_width <= build["max_beam_width"]
        return cls(engine_dir, config, max_batch_size, max_input_len, max_seq_len, max_beam_width)

    @property
    def gather_generation_logits(self):
        return self._gather_generation_logits

    @property
    def vocab_size(self):
        return self.config["pretrained_config"]["vocab_size"]

    @property
    def vocab_size_padded(self):
        # ModelConfig.vocab_size_padded(world_config.size): padded to the world size, tp x pp
        mapping = self.config["pretrained_config"].get("mapping", {})
        world = mapping.get("tp_size", 1) * mapping.get("pp_size", 1)
        return -(-self.vocab_size // world) * world

    def _check_inputs(self, batch_input_ids_list, beam_width, max_new_tokens):
        if len(batch_input_ids_list) > self.max_batch_size:
            raise RuntimeError(
                f"Input batch size ({len(batch_input_ids_list)}) exceeds the engine or specified limit "
                f"({self.max_batch_size})"
            )
        max_length = max(len(x) for x in batch_input_ids_list)
        if max_length > self.max_input_len:
            raise RuntimeError(
                f"Maximum input length ({max_length}) exceeds the engine or specified limit ({self.max_input_len})"
            )
        if max_length + max_new_tokens > self.max_seq_len:
            raise RuntimeError(
                f"Maximum input length ({max_length}) + maximum new tokens ({max_new_tokens}) exceeds the engine "
                f"or specified limit ({self.max_seq_len})"
            )
        if beam_width > self.max_beam_width:
            raise RuntimeError(
                f"Num beams ({beam_width}) exceeds the engine or specified limit ({self.max_beam_width})"
            )

    def generate(
        self,
        batch_input_ids,
        *,
        position_ids=None,
        encoder_input_ids=None,
        encoder_input_features=None,
        encoder_output_lengths=None,
        cross_attention_masks=None,
        mrope_params=None,
        sampling_config=None,
        lora_uids=None,
        lookahead_config=None,
        streaming=False,
        stopping_criteria=None,
        logits_processor_names=None,
        max_new_tokens=1,
        end_id=None,
        pad_id=None,
        bad_words_list=None,
        stop_words_list=None,
        return_dict=False,
        output_sequence_lengths=False,
        output_generation_logits=False,
        output_log_probs=False,
        output_cum_log_probs=False,
        prompt_table=None,
        prompt_tasks=None,
        input_token_extra_ids=None,
        return_all_generated_tokens=False,
        language_adapter_uids=None,
        mm_embedding_offloading=False,
        **kwargs,
    ):
        if stopping_criteria is not None:
            raise RuntimeError("Stopping criteria is not supported in C++ session.")
        assert not streaming and sampling_config is None, "the stand-in runs non-streaming kwargs calls only"
        record = dict(kwargs, max_new_tokens=max_new_tokens, end_id=end_id, stop_words_list=stop_words_list)
        record["prompts"] = [
            list(map(int, a)) for a in batch_input_ids
        ]  # what the call was given (for tests)
        type(self).calls.append((self.engine_dir, record))
        prompts = [a.tolist() for a in batch_input_ids]
        self._check_inputs(prompts, kwargs.get("num_beams", 1), max_new_tokens)
        draft_tokens_list = kwargs.get("draft_tokens_list")
        draft_logits_list = kwargs.get("draft_logits_list")
        self._check_draft(draft_tokens_list, draft_logits_list)
        want_logits = self.gather_generation_logits or output_generation_logits
        generated, logits = [], []
        for b, prompt in enumerate(prompts):
            # One SamplingConfig for every request of the call, and each request's random state starts from its
            # seed (curand_init(randomSeeds[slot], 0, 0)): rows of one call draw the same numbers.
            sampling = _Sampling(kwargs)
            stops = stop_words_list[b] if stop_words_list else None
            if draft_tokens_list is not None:
                draft_logits = draft_logits_list[b] if draft_logits_list is not None else None
                tokens, rows = self._verify(
                    prompt, draft_tokens_list[b], draft_logits, sampling, max_new_tokens, end_id
                )
            else:
                tokens, rows = self._decode(prompt, max_new_tokens, sampling, end_id, stops)
            generated.append(tokens)
            logits.append(rows)
        outputs = {"output_ids": self._output_ids(prompts, generated, end_id)}
        if not return_dict:
            return outputs["output_ids"]
        if output_sequence_lengths:
            outputs["sequence_lengths"] = torch.tensor(
                [[len(p) + len(t)] for p, t in zip(prompts, generated, strict=True)], dtype=torch.int32
            )
        if want_logits:
            outputs["generation_logits"] = _pack_logits(logits, draft_tokens_list is not None)
        return outputs

    def _check_draft(self, draft_tokens_list, draft_logits_list):
        if draft_tokens_list is None:
            return
        for tokens in draft_tokens_list:
            if len(tokens) > self.max_draft_len:
                raise RuntimeError(
                    f"Number of draft tokens ({len(tokens)}) is larger than maximum number of draft tokens "
                    f"({self.max_draft_len})"
                )
        if draft_logits_list is not None and not self.gather_generation_logits:
            # The real runtime hangs here (TensorRT-LLM issue 2798); a test must not.
            raise RuntimeError("fake: draft logits without --gather_generation_logits would hang")
        for tokens, logits in zip(draft_tokens_list, draft_logits_list or [], strict=False):
            # The real runtime copies them into a [k, vocabSizePadded] buffer (BufferManager::copy checks bytes).
            want = len(tokens) * self.vocab_size_padded * 4
            have = logits[: len(tokens)].numel() * 4
            if have != want:
                raise RuntimeError(f"[TensorRT-LLM][ERROR] Incompatible buffer sizes: {have} != {want}")

    def _logits(self, ids):
        with torch.no_grad():
            return self.model(torch.tensor([ids])).logits[0].float()  # [len(ids), V]

    def _decode(self, prompt, max_new_tokens, sampling, end_id, stop_words):
        ids, rows = list(prompt), []
        for _ in range(max_new_tokens):
            row = self._logits(ids)[-1]
            token = sampling.pick(row)
            if token == end_id:
                break
            ids.append(token)
            rows.append(row)
            if any(w and ids[-len(w) :] == list(w) for w in stop_words or []):
                break
        return ids[len(prompt) :], rows

    def _verify(self, prompt, draft_tokens, draft_logits, sampling, max_new_tokens, end_id):
        k = len(draft_tokens)
        rows = self._logits(list(prompt) + list(draft_tokens))[len(prompt) - 1 :]  # [K+1, V]
        out = []
        for i in range(k):
            if draft_logits is None or sampling.greedy:
                token = sampling.pick(rows[i])
                if token != draft_tokens[i]:
                    out.append(token)  # the target's own token replaces the rejected draft token
                    break
            else:
                token = sampling.accept_or_recover(rows[i], draft_logits[i], draft_tokens[i])
                if token is not None:
                    out.append(token)
                    break
            out.append(draft_tokens[i])
        else:
            out.append(sampling.pick(rows[k]))  # every draft token accepted: the bonus token
        out = out[:max_new_tokens]
        if end_id in out:  # the end token (accepted or the target's) ends the request, left out
            out = out[: out.index(end_id)]
        return out, [rows[i] for i in range(len(out))]

    def _output_ids(self, prompts, generated, end_id):
        # Padded by end_id to max_seq_len, as the real _fill_output.
        pad = end_id if end_id is not None else 0
        out = torch.full((len(prompts), 1, self.max_seq_len), pad, dtype=torch.int32)
        for b, (p, t) in enumerate(zip(prompts, generated, strict=True)):
            out[b, 0, : len(p) + len(t)] = torch.tensor(p + t, dtype=torch.int32)
        return out


class _Sampling:
    """The kwargs sampling knobs: greedy when top_k == 1 (or neither top_k nor top_p is set)."""

    def __init__(self, kwargs):
        self.temperature = kwargs.get("temperature", 1.0) or 1.0
        self.top_k = kwargs.get("top_k") or 0
        top_p = kwargs.get("top_p")
        self.top_p = top_p if top_p else 1.0
        self.greedy = self.top_k == 1 or (self.top_k == 0 and not top_p)
        seed = kwargs.get("random_seed")
        self.generator = torch.Generator().manual_seed(0 if seed is None else int(seed))

    def probs(self, row):
        row = row / self.temperature
        if 0 < self.top_k < row.shape[-1]:
            row = row.masked_fill(row < row.topk(self.top_k).values[-1], float("-inf"))
        probs = row.softmax(-1)
        if self.top_p < 1.0:
            ordered, order = probs.sort(descending=True)
            drop = ordered.cumsum(-1) - ordered >= self.top_p
            probs = probs.masked_fill(drop.scatter(0, order, drop), 0.0)
        return probs / probs.sum()

    def pick(self, row):
        if self.greedy:
            return int(row.argmax())
        return int(torch.multinomial(self.probs(row), 1, generator=self.generator))

    def accept_or_recover(self, target_row, draft_row, draft_token):
        """None when draft_token is accepted, else the recovered token."""
        target_probs, draft_probs = self.probs(target_row), self.probs(torch.as_tensor(draft_row).float())
        u = torch.rand((), generator=self.generator)
        if u * draft_probs[draft_token] < target_probs[draft_token]:
            return None
        residual = (target_probs - draft_probs).clamp(min=0)
        residual = residual if residual.sum() > 0 else target_probs
        return int(torch.multinomial(residual, 1, generator=self.generator))


def _pack_logits(logits, draft_target):
    if draft_target:  # one [1, n, V] per response (the real code collects them in response order)
        return [torch.stack(rows)[None] for rows in logits if rows]
    width = max(len(rows) for rows in logits)
    vocab = logits[0][0].shape[-1]
    out = torch.zeros((len(logits), 1, width, vocab), dtype=torch.float32)
    for b, rows in enumerate(logits):
        if rows:
            out[b, 0, : len(rows)] = torch.stack(rows)
    return out
