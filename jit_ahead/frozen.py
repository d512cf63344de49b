"""Frozen records declared as dataclasses are (annotated fields, class-level defaults, frozen instances,
equality, hashing) but made by one base class: defining one costs no generated code, which matters for
what every ``JIT_AHEAD=1`` process defines at start (the stats events, the family registry's entries).
Imports nothing: the start-up hook's registry uses it.
"""


class Factory:
    """A field's default made anew for each record (``Factory(dict)``), as dataclasses' default_factory."""

    def __init__(self, make) -> None:
        self.make = make


class Frozen:
    """A frozen record whose fields are its class's annotations (after its bases'), with the class-level
    values as defaults."""

    _fields = ()  # the field names, bases' first
    _defaults = {}  # field name -> default value or Factory

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        # the class's own annotations: in its dict, or made on access where annotations are lazy (3.14)
        hints = cls.__dict__.get("__annotations__")
        if hints is None:
            hints = cls.__annotations__ if "__annotate__" in cls.__dict__ else {}
        own = [n for n, hint in hints.items() if "ClassVar" not in str(hint)]
        cls._fields = tuple(dict.fromkeys((*cls._fields, *own)))
        cls._defaults = {**cls._defaults, **{n: cls.__dict__[n] for n in own if n in cls.__dict__}}

    def __init__(self, *args, **kwargs) -> None:
        cls = type(self)
        if len(args) > len(cls._fields):
            raise TypeError(f"{cls.__name__} takes {len(cls._fields)} fields, {len(args)} given")
        values = dict(zip(cls._fields, args))
        for key, value in kwargs.items():
            if key not in cls._fields or key in values:
                raise TypeError(f"{cls.__name__}: unknown or repeated field {key!r}")
            values[key] = value
        for key in cls._fields:
            if key not in values:
                if key not in cls._defaults:
                    raise TypeError(f"{cls.__name__} needs the field {key!r}")
                default = cls._defaults[key]
                values[key] = default.make() if isinstance(default, Factory) else default
        object.__setattr__(self, "__dict__", values)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other.__dict__ == self.__dict__

    def __hash__(self) -> int:
        return hash((type(self), *self.__dict__.values()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"
