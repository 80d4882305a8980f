"""One rule for an attribute passed through: read live from the object that holds it."""

from __future__ import annotations

from typing import Generic, NoReturn, TypeVar, overload

__all__ = ["Live"]

T = TypeVar("T")


class Live(property, Generic[T]):
    """A read-only attribute that reads its inner object's of the same name, live.

    The one rule of every attribute an object passes through: ``inner`` is
    the owner's attribute holding the inner object (a :class:`BlockingAgent`'s
    :class:`Agent`, a :class:`Fleet`'s :class:`AsyncFleet`, a
    :class:`BlockingMonitor`'s :class:`Monitor`, a :class:`SystemdManager`'s
    :class:`SystemdBus`), ``of`` the inner class its docstring refers to.
    Whoever updates the inner object (the blocking facades' loop thread, the
    bus as it connects) is read at once: a read takes no trip to the loop.
    """

    def __init__(self, inner: str, of: str) -> None:
        super().__init__()
        self._inner, self._of = inner, of

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name
        self.__doc__ = f"See :attr:`{self._of}.{name}`."

    @overload
    def __get__(self, obj: None, owner: type | None = None, /) -> Live[T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None, /) -> T: ...
    def __get__(self, obj: object, owner: type | None = None, /) -> Live[T] | T:
        if obj is None:
            return self
        value: T = getattr(getattr(obj, self._inner), self._name)
        return value

    def __set__(self, obj: object, value: object, /) -> NoReturn:
        raise AttributeError(f"{self._name} is read-only: the {self._of}'s own, read live")
