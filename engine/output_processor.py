"""A step's sampled tokens become requests' tokens, stop decisions and RequestOutputs.

LLMEngine owns one OutputProcessor; both hold the engine's LiveRequests (engine/live_requests.py), which the
engine fills in `add_request` and the processor empties as requests finish.
"""

from __future__ import annotations

from engine.launched_step import ModelRunnerOutput
from engine.live_requests import LiveRequests
from engine.outputs import PromptLogprobs, RequestOutput
from engine.request import FinishReason, Request, RequestStatus
from engine.scheduler import Scheduler


class OutputProcessor:
    """Turns a step's tokens into outputs and finishes the requests that stop.

    Args:
        scheduler: the engine's scheduler (a finished request's blocks go back through it).
        live: the engine's live requests.
    """

    def __init__(self, scheduler: Scheduler, live: LiveRequests) -> None:
        self.scheduler = scheduler
        self.live = live
        self.num_generated = 0  # tokens appended to requests, over the engine's life

    def process(self, result: ModelRunnerOutput) -> list[RequestOutput]:
        """One step's tokens (and prompt logprobs) -> the outputs of its requests."""
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
            self.live.prompt_logprob_ids.discard(request.request_id)
        return outputs

    def _process_tokens(self, result: ModelRunnerOutput) -> list[RequestOutput]:
        # NOTE: this runs for every running request at every step (256 a step under load), so the
        # common case (a token, no logprobs, no stop) is written inline: no helper calls, the
        # output built positionally, the stop checks against what the request computed once
        # (stop_token_set, max_num_tokens) (decisions 0022, 0023).
        if result.verified is not None:
            return self._process_verified(result)
        outputs = []
        detokenizers = self.live.detokenizers
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
                outputs.append(self.finished_output(request, [], "", None))
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
            # a grammar that allows nothing but a stop token after this one ends the output here
            grammar = request.grammar
            if by_token or detok.stopped or (grammar is not None and grammar.ends_after(token)):
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
            outputs.append(self.finished_output(request, [token], text, None if logprob is None else [logprob]))
        self.num_generated += generated
        return outputs

    def _process_verified(self, result: ModelRunnerOutput) -> list[RequestOutput]:
        """A verification step's tokens (speculative decoding): each request takes its kept tokens one by one,
        with every stop rule checked after each, so the tokens after a stop are dropped (the KV the step
        wrote for them is never read: the request finishes)."""
        outputs = []
        for request, verified in zip(result.requests, result.verified, strict=True):
            request.num_pending_tokens -= 1
            if request.status is RequestStatus.FINISHED:
                continue
            outputs.append(self._take_tokens(request, verified.token_ids, verified.logprobs, verified.error))
        return outputs

    def _take_tokens(self, request: Request, tokens: list[int], logprobs: list, error: str | None) -> RequestOutput:
        """Appends tokens to the request until one stops it; the one output of the request's step."""
        detok = self.live.detokenizers[request.request_id]
        min_tokens = request.sampling_params.min_tokens
        taken, taken_logprobs, text = [], [], ""
        reason = None
        for token, logprob in zip(tokens, logprobs, strict=True):
            request.append_token(token)
            self.num_generated += 1
            taken.append(token)
            if logprob is not None:
                request.output_logprobs.append(logprob)
                taken_logprobs.append(logprob)
            by_token = token in request.stop_token_set and request.num_output_tokens > min_tokens
            if not by_token:
                text += detok.add_token(token)
            # a constrained request (it never verifies proposals) takes its one token through its grammar here too
            grammar = request.grammar
            if by_token or detok.stopped or (grammar is not None and grammar.ends_after(token)):
                reason = FinishReason.STOP
            elif request.num_tokens >= request.max_num_tokens:
                reason = FinishReason.LENGTH
            if reason is not None:
                break
        new_logprobs = taken_logprobs if request.sampling_params.logprobs is not None else None
        if reason is None and error is None:
            return RequestOutput(
                request.parent_id or request.request_id,
                request.choice_index,
                taken,
                text,
                new_logprobs,
                False,
                None,
                len(request.prompt_token_ids) - request.num_prior_output_tokens,
                request.num_output_tokens,
            )
        if reason is not None and not detok.stopped:
            text += detok.flush()
        self.scheduler.finish_request(request, reason or FinishReason.ERROR, None if reason else error)
        return self.finished_output(request, taken, text, new_logprobs)

    # ---- outputs ------------------------------------------------------------------
    def finished_output(self, request: Request, tokens: list[int], text: str, logprobs: list | None) -> RequestOutput:
        """The final output of a request the scheduler has finished; the request is no longer live."""
        out = RequestOutput(
            request_id=request.parent_id or request.request_id,
            index=request.choice_index,
            new_token_ids=tokens,
            new_text=text,
            new_logprobs=logprobs,
            finished=True,
            finish_reason=request.finish_reason.value if request.finish_reason else None,
            num_prompt_tokens=request.num_prompt_tokens - request.num_prior_output_tokens,
            num_output_tokens=request.num_output_tokens,
            error=request.error,
        )
        self.live.forget(request)
        return out
