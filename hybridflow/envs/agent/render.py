"""Messages -> token ids with the tokenizer's own chat template, one turn at a time.

    r = ChatRenderer(tokenizer)
    ids = r.prompt(messages, tools)                       # first prompt, generation prompt included
    ids = r.observation(messages, turn_ids, obs, tools)   # tokens to append after the model's turn
"""

from __future__ import annotations

import json
from typing import Any

from hybridflow.envs.agent.base import Message


class RenderError(ValueError):
    """The chat template cannot render this conversation incrementally."""


class ChatRenderer:
    def __init__(self, tokenizer) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("multi-turn rollouts need a tokenizer with a chat template")
        self.tokenizer = tokenizer

    def _text(self, messages: list[Message], tools: list[dict] | None, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=generation_prompt)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt(self, messages: list[Message], tools: list[dict] | None) -> list[int]:
        """Token ids of the first prompt (pass messages through `with_tools` first)."""
        return self.encode(self._text(messages, tools, True))

    def with_tools(self, messages: list[Message], tools: list[dict] | None) -> list[Message]:
        """`messages`, plus a system message describing `tools` in the Hermes form when the
        chat template ignores `tools=` (SmolLM2's, for one), so the model still sees them."""
        if not tools or self._text(messages, tools, True) != self._text(messages, None, True):
            return messages
        listing = "\n".join(json.dumps(t, sort_keys=True) for t in tools)
        note = (f"You can call these tools:\n<tools>\n{listing}\n</tools>\nTo call one, write "
                '<tool_call>{"name": <name>, "arguments": {<args>}}</tool_call>; its answer comes back '
                "in the next message. Then give the final answer.")
        if messages and messages[0]["role"] == "system":
            return [{"role": "system", "content": messages[0]["content"] + "\n\n" + note}, *messages[1:]]
        return [{"role": "system", "content": note}, *messages]

    def turn_text(self, turn_ids: list[int], stop_ids: frozenset[int]) -> str:
        """The model's turn as the environment reads it: decoded, without its stop token."""
        body = turn_ids[:-1] if turn_ids and turn_ids[-1] in stop_ids else turn_ids
        return self.tokenizer.decode(body, skip_special_tokens=False)

    def observation(self, history: list[Message], turn_ids: list[int], observation: list[Message],
                    tools: list[dict] | None) -> list[int]:
        """Tokens between the end of the model's turn (its stop token) and the next turn."""
        before = self._text(history, tools, False)
        after = self._text(history + observation, tools, True)
        stop_text = self.tokenizer.decode(turn_ids[-1:], skip_special_tokens=False)
        end = before.rfind(stop_text) + len(stop_text) if stop_text else -1
        if not stop_text or end < len(stop_text) or not after.startswith(before[:end]):
            raise RenderError(f"cannot find the model's stop token {stop_text!r} in the rendered conversation")
        return self.encode(after[end:])


def assistant_message(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}
