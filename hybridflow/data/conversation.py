"""Multi-turn SFT rows from chat messages, rendered with the model's own chat template."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Message = dict[str, Any]


def conversation_row(tokenizer: Any, messages: Sequence[Message],
                     tools: list[dict] | None = None) -> dict[str, list[int]]:
    """{"prompt_ids", "response_ids", "response_loss_mask"} of one conversation (module docstring).
    `tools`: function schemas the template renders into the prompt (as `apply_chat_template(tools=...)`)."""
    messages = [dict(m) for m in messages]
    roles = [m.get("role") for m in messages]
    if "assistant" not in roles:
        raise ValueError("a conversation needs at least one assistant message to train on")
    first = roles.index("assistant")
    if first == 0:
        raise ValueError("the conversation starts with an assistant message; give the user's (or system) message "
                         "before it")
    eos = tokenizer.eos_token
    if eos is None:
        raise ValueError("the tokenizer has no eos token: the end of a model turn cannot be marked")

    def text(upto: int, generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(messages[:upto], tools=tools or None, tokenize=False,
                                             add_generation_prompt=generation_prompt)

    def encode(piece: str) -> list[int]:
        return tokenizer(piece, add_special_tokens=False)["input_ids"] if piece else []

    covered = text(first, True)  # the prompt
    response: list[int] = []
    mask: list[int] = []
    last = max(i for i, role in enumerate(roles) if role == "assistant")
    for k in range(first, last + 1):
        if roles[k] != "assistant":
            continue
        before, after = text(k, True), text(k + 1, False)
        if not before.startswith(covered) or not after.startswith(before):
            raise ValueError(f"message {k}: the chat template renders earlier turns differently once this one is "
                             "added, so the conversation cannot be split into turns; train on it as prompt/response")
        context = encode(before[len(covered):])  # other messages and the template's turn headers
        turn = after[len(before):]
        end = turn.rfind(eos)
        # The model's turn ends at eos; what the template writes after it (a newline) is context.
        own, tail = (turn[: end + len(eos)], turn[end + len(eos):]) if end >= 0 else (turn + eos, "")
        own_ids, tail_ids = encode(own), encode(tail)
        response += context + own_ids + tail_ids
        mask += [0] * len(context) + [1] * len(own_ids) + [0] * len(tail_ids)
        covered = after
    return {"prompt_ids": encode(text(first, True)), "response_ids": response, "response_loss_mask": mask}
