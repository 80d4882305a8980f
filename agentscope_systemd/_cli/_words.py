"""A command line's words as the fast paths read them, click's rules written once.

``exec``, ``call``, the global options and the commands run without typer
(:mod:`._direct`) each read their own options, before typer or without
it; how a word is read is the same for all of them and is here: ``--``
ends the options, ``-h``/``--help`` asks for help, an option's value is
after its ``=`` or the next word (whatever it looks like, as click takes
it). What each reader does with an option stays its own.

The standard library only, and little of it: ``agentscope exec`` reads its
words through this module before it execs.
"""

from __future__ import annotations

from .._typecheck import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    from collections.abc import Iterator, Sequence

__all__ = ["Words", "option_value"]


def option_value(args: Sequence[str], i: int) -> tuple[str, str, int] | None:
    """The option ``args[i]`` names, its value, and the index of the last word it took.

    ``--opt=value`` is one word; ``--opt value`` takes the next word, whatever
    it looks like (click's rule). None: no value, ``args[i]`` is the last word.
    """
    key, eq, value = args[i].partition("=")
    if eq:
        return key, value, i
    if i + 1 >= len(args):
        return None
    return key, args[i + 1], i + 1


class Words:
    """The words of a command that reads its options up to its command (``exec``, ``call``).

    Iterate :meth:`options` for the words before the command; the reader
    ``break``s at the first word that is the command, takes an option's
    value with :meth:`value`, and the command is :meth:`rest`.
    """

    def __init__(self, args: Sequence[str]) -> None:
        self._args = list(args)
        self._at = 0

    def options(self, help: type[Exception]) -> Iterator[str]:
        """Each word up to ``--`` (skipped) or the end; ``-h``/``--help`` raises ``help``."""
        while self._at < len(self._args):
            arg = self._args[self._at]
            if arg == "--":
                self._at += 1
                return
            if arg in ("-h", "--help"):
                raise help
            yield arg
            self._at += 1

    def value(self, option: str) -> str | None:
        """The value of the current word's option (after its ``=``, or the next word).

        ``option`` is the option's name as the current word spells it
        (``--memory-max``; ``-p`` takes the next word only). None: it is
        the last word and has no value.
        """
        arg = self._args[self._at]
        if arg.startswith(f"{option}="):
            return arg[len(option) + 1 :]
        if self._at + 1 >= len(self._args):
            return None
        self._at += 1
        return self._args[self._at]

    def rest(self) -> list[str]:
        """The words from the current one on: the command and its arguments."""
        return self._args[self._at :]
