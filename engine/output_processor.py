"""LLMEngine's second half: a step's sampled tokens become requests' tokens, stop decisions
and RequestOutputs.

A mixin of engine.llm_engine.LLMEngine, split out by idea; it uses the engine's scheduler,
requests, _children, _detokenizers, _sync_request_ids, _prompt_logprob_ids, max_model_len and _num_generated.
"""

from __future__ import annotations

from engine.launched_step import ModelRunnerOutput
from engine.outputs import PromptLogprobs, RequestOutput
from engine.request import FinishReason, Request, RequestStatus


class OutputProcessing:
    def _process(self, result: ModelRunnerOutput) -> list[RequestOutput]:
        if result.prompt_logprobs:
            return self._process_with_prompt_logprobs(result)
        return self._process_tokens(result)

    def _process_with_prompt_logprobs(self, result: ModelRunnerOutput) -> list[RequestOutput]:
        """The step's prompt logprobs go to their requests; a request whose prompt logprobs are complete hands
        them over with its first token's output (its last prompt chunk is the step that samples that token)."""
        complete = {}
        for request, start, logprobs in result.prompt_logprobs:
            request.add_prompt_logprobs(start, logprobs)
            if request.prompt_logprobs is not None and not request.computes_prompt_logprobs:
                complete[(request.parent_id or request.request_id, request.choice_index)] = request
        outputs = self._process_tokens(result)
        for out in outputs:
            request = complete.get((out.request_id, out.index))
            if request is not None and out.new_token_ids:
                out.prompt_logprobs = PromptLogprobs(list(request.prompt_token_ids), request.prompt_logprobs)
        for request in complete.values():
            request.prompt_logprobs = None  # delivered, or its request ended without a token
            self._prompt_logprob_ids.discard(request.request_id)
        return outputs

    def _process_tokens(self, result: ModelRunnerOutput) -> list[RequestOutput]:
        # NOTE: this runs for every running request at every step (256 a step under load), so the
        # common case (a token, no logprobs, no stop) is written inline: no helper calls, the
        # output built positionally, the stop checks against what the request computed once
        # (stop_token_set, max_num_tokens). On the dev box that took it from 13 to 4 us a request
        # (with engine/byte_level.py's detokenizer), then to ~1 us (bench/engine_host_step.py, warm caches).
        outputs = []
        detokenizers = self._detokenizers
        finished, stop, length = RequestStatus.FINISHED, FinishReason.STOP, FinishReason.LENGTH
        generated = 0
        for request, token, logprob, error in zip(
            result.requests, result.token_ids, result.logprobs, result.errors, strict=True
        ):
            request.num_pending_tokens -= 1
            if request.status is finished:
                # Async scheduling: the request stopped (or was aborted) after this step was launched.
                continue
            if error is not None:
                self.scheduler.finish_request(request, FinishReason.ERROR, error)
                outputs.append(self._finished_output(request, [], "", None))
                continue
            generated += 1
            output_ids, all_ids = request.output_token_ids, request.all_token_ids
            output_ids.append(token)
            all_ids.append(token)
            if logprob is not None:
                request.output_logprobs.append(logprob)
            num_output = request.num_prior_output_tokens + len(output_ids)
            # EOS and stop tokens count only once min_tokens are out
            by_token = token in request.stop_token_set and num_output > request.sampling_params.min_tokens
            detok = detokenizers[request.request_id]
            text = "" if by_token else detok.add_token(token)
            if by_token or detok.stopped:
                reason = stop
            elif len(all_ids) >= request.max_num_tokens:  # max_tokens, or the model's context
                reason = length
            else:
                outputs.append(
                    RequestOutput(
                        request.parent_id or request.request_id,
                        request.choice_index,
                        [token],
                        text,
                        None if logprob is None else [logprob],
                        False,
                        None,
                        len(request.prompt_token_ids) - request.num_prior_output_tokens,
                        num_output,
                    )
                )
                continue
            if not detok.stopped:
                text += detok.flush()
            self.scheduler.finish_request(request, reason)
            outputs.append(self._finished_output(request, [token], text, None if logprob is None else [logprob]))
        self._num_generated += generated
        return outputs

    # ---- outputs ------------------------------------------------------------------
    def _output(
        self, request: Request, tokens: list[int], text: str, logprobs: list | None, finished: bool
    ) -> RequestOutput:
        return RequestOutput(
            request_id=request.parent_id or request.request_id,
            index=request.choice_index,
            new_token_ids=tokens,
            new_text=text,
            new_logprobs=logprobs,
            finished=finished,
            finish_reason=request.finish_reason.value if request.finish_reason else None,
            num_prompt_tokens=request.num_prompt_tokens - request.num_prior_output_tokens,
            num_output_tokens=request.num_output_tokens,
            error=request.error,
        )

    def _finished_output(self, request: Request, tokens: list[int], text: str, logprobs: list | None) -> RequestOutput:
        out = self._output(request, tokens, text, logprobs, True)
        self._forget(request)
        return out

    def _forget(self, request: Request) -> None:
        self.requests.pop(request.request_id, None)
        self._detokenizers.pop(request.request_id, None)
        self._sync_request_ids.discard(request.request_id)
        self._prompt_logprob_ids.discard(request.request_id)
        parent = request.parent_id or request.request_id
        siblings = self._children.get(parent, [])
        if all(sid not in self.requests for sid in siblings):
            self._children.pop(parent, None)
