"""Per-request detokenization state: token ids in, text deltas and finishes out."""

from __future__ import annotations

from dataclasses import dataclass, field

from reference_server.detokenizer.incremental import DecodeTable, OutputDecoder
from reference_server.detokenizer.stops import StopStringMatcher
from reference_server.ipc import DetokenizeConfig, Finish, OutputEvent, SequenceOutput


@dataclass
class OutputText:
    decoder: OutputDecoder
    matcher: StopStringMatcher
    num_tokens: int = 0
    finished: bool = False


@dataclass
class RequestText:
    rid: str
    config: DetokenizeConfig
    outputs: list[OutputText] = field(default_factory=list)

    @classmethod
    def create(cls, table: DecodeTable, rid: str, num_outputs: int, config: DetokenizeConfig) -> RequestText:
        outputs = [
            OutputText(
                table.decoder(
                    skip_special_tokens=config.skip_special_tokens, whole_tokens=config.whole_token_text
                ),
                StopStringMatcher(config.stop_strings, include_stop=config.include_stop_in_output),
            )
            for _ in range(num_outputs)
        ]
        return cls(rid, config, outputs)

    @property
    def done(self) -> bool:
        return all(out.finished for out in self.outputs)

    def process(self, step: SequenceOutput) -> tuple[OutputEvent | None, bool]:
        """Turn one engine output into an event. The flag says the detokenizer ended the
        output itself (a stop string matched), so the engine must be told to stop it."""
        out = self.outputs[step.output_index]
        if out.finished:
            return None, False
        config = self.config
        finish = step.finish
        ends_on_stop_token = finish is not None and finish.reason == "stop" and finish.stop_string is None
        texts: list[str] = []
        kept = 0
        stopped_here = False
        for position, token_id in enumerate(step.token_ids):
            out.num_tokens += 1
            kept += 1
            is_stop_token = ends_on_stop_token and position == len(step.token_ids) - 1
            piece = "" if is_stop_token and not config.include_stop_in_output else out.decoder.feed(token_id)
            scan = out.matcher.feed(piece, can_stop=out.num_tokens >= config.min_tokens)
            texts.append(scan.text)
            if scan.matched is not None:
                finish = Finish("stop", stop_string=scan.matched)
                stopped_here = True
                break
        if finish is not None and not stopped_here:
            texts.append(out.matcher.feed(out.decoder.flush(), can_stop=False).text)
            texts.append(out.matcher.flush())
        out.finished = finish is not None
        logprobs = step.logprobs[:kept] if step.logprobs is not None else None
        event = OutputEvent(
            rid=self.rid,
            output_index=step.output_index,
            token_ids=list(step.token_ids[:kept]),
            text="".join(texts) if config.return_text else "",
            logprobs=logprobs,
            finish=finish,
            completion_tokens=out.num_tokens,
            cached_prompt_tokens=step.cached_prompt_tokens,
        )
        return event, stopped_here and step.finish is None
