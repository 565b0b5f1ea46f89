"""A probe in the model's own chat template: the prompt is the user turn's text, each question closes that turn
and its answer stem ("The code for the tin box is") opens the assistant turn, so the key is what the assistant says
first. The template is rendered once around a placeholder and cut there, so whatever system turn or markers a
model's template adds are kept as it writes them."""

from __future__ import annotations

PLACEHOLDER = "\x00probe\x00"  # text no prompt holds


def user_turn(tokenizer) -> tuple[list[int], str]:
    """(the token ids before a user turn's text, the text after it up to the assistant's first word)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("--chat-template: this model's tokenizer has no chat template (tokenizer.chat_template)")
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": PLACEHOLDER}], tokenize=False, add_generation_prompt=True
    )
    if rendered.count(PLACEHOLDER) != 1:
        raise ValueError("--chat-template: the template does not write the user's text exactly once")
    head, tail = rendered.split(PLACEHOLDER)
    return tokenizer(head, add_special_tokens=False)["input_ids"], tail


def question(tokenizer, text: str) -> str:
    """A test question (" What is the code for the tin box? The code for the tin box is") as chat text: the question
    closing the user turn, the answer stem (after "? ") opening the assistant's."""
    asked, mark, stem = text.partition("? ")
    if not mark or not stem:
        raise ValueError(f"question {text!r}: expected a question and an answer stem after '? '")
    return asked + "?" + user_turn(tokenizer)[1] + stem
