"""What a request sent comes back in an error message cut short; Ferry's own words never are."""

from __future__ import annotations

from ferry.errors import MAX_ECHO, MAX_MESSAGE, NotFoundError, clip_echoes


def test_a_long_id_is_cut_and_the_message_around_it_kept() -> None:
    error = NotFoundError("unknown_task", f"no task {'a' * 5000!r}: it never existed, or its "
                          "result expired (600 s after it finished)")
    assert error.message == (f"no task '{'a' * (MAX_ECHO - 1)}… it never existed, or its result "
                             "expired (600 s after it finished)")
    assert str(error) == error.message


def test_every_long_word_is_cut_and_short_ones_are_kept() -> None:
    words = ["b" * (MAX_ECHO + 1), "c" * MAX_ECHO, "d" * 3 * MAX_ECHO]
    assert clip_echoes(" ".join(words)).split(" ") == [
        "b" * MAX_ECHO + "…", "c" * MAX_ECHO, "d" * MAX_ECHO + "…"]


def test_a_message_of_many_short_words_is_cut_at_its_limit() -> None:
    clipped = clip_echoes("ab " * 2000)
    assert len(clipped) == MAX_MESSAGE + 1 and clipped.endswith("…")


def test_ferrys_own_messages_are_unchanged() -> None:
    message = ("model 'sim' has no version 7; ready versions: 1, 2 (a sha256: "
               f"{'0' * 64})")
    assert clip_echoes(message) == message
