"""LLMEngine's second half: a step's sampled tokens become requests' tokens, stop decisions
and RequestOutputs.

A mixin of engine.llm_engine.LLMEngine, split out by idea; it uses the engine's scheduler,
requests, _children, _detokenizers, _sync_request_ids, max_model_len and _num_generated.
"""

from __future__ import annotations

from engine.launched_step import ModelRunnerOutput
from engine.outputs import RequestOutput
from engine.request import FinishReason, Request, RequestStatus


class OutputProcessing:
    def _process(self, result: ModelRunnerOutput) -> list[RequestOutput]:
        # NOTE: this runs for every running request at every step (256 a step under load), so the
        # common case (a token, no logprobs, no stop) is written inline: no helper calls, the
        # output built positionally. On the dev box that took it from 13 to 4 us a request
        # (with engine/byte_level.py's detokenizer).
        outputs = []
        detokenizers = self._detokenizers
        finished, stop = RequestStatus.FINISHED, FinishReason.STOP
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
            self._num_generated += 1
            request.output_token_ids.append(token)
            request.all_token_ids.append(token)
            if logprob is not None:
                request.output_logprobs.append(logprob)
            reason = self._stop_by_token(request, token)
            detok = detokenizers[request.request_id]
            text = detok.add_tokens([token]) if reason is not stop else ""
            if detok.stopped:
                reason = stop
            elif reason is None:
                reason = self._stop_by_length(request)
            new_logprobs = [logprob] if logprob is not None else None
            if reason is None:
                outputs.append(
                    RequestOutput(
                        request.parent_id or request.request_id,
                        request.choice_index,
                        [token],
                        text,
                        new_logprobs,
                        False,
                        None,
                        len(request.prompt_token_ids) - request.num_prior_output_tokens,
                        request.num_prior_output_tokens + len(request.output_token_ids),
                    )
                )
                continue
            if not detok.stopped:
                text += detok.flush()
            self.scheduler.finish_request(request, reason)
            outputs.append(self._finished_output(request, [token], text, new_logprobs))
        return outputs

    def _stop_by_token(self, request: Request, token: int) -> FinishReason | None:
        params = request.sampling_params
        if request.num_output_tokens <= params.min_tokens:
            return None
        if token in params.stop_token_ids or (not params.ignore_eos and token in request.eos_token_ids):
            return FinishReason.STOP
        return None

    def _stop_by_length(self, request: Request) -> FinishReason | None:
        max_tokens = request.sampling_params.max_tokens
        if max_tokens is not None and request.num_output_tokens >= max_tokens:
            return FinishReason.LENGTH
        if request.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None

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
        parent = request.parent_id or request.request_id
        siblings = self._children.get(parent, [])
        if all(sid not in self.requests for sid in siblings):
            self._children.pop(parent, None)
