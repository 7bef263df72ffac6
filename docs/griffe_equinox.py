"""A Griffe extension that gives `equinox.Module` classes their generated `__init__`.

Equinox turns every `eqx.Module` subclass into a dataclass through its metaclass, not through
the `@dataclass` decorator, so Griffe's static analysis (which mkdocstrings uses) sees no
constructor: the API pages would show `LIF` without `tau_m=10.0, ...`, and the `Args:`
section of each class docstring would be reported as parameters missing from the signature.
This extension rebuilds the constructor the way equinox does: the annotated instance fields
of the class and of its `eqx.Module` bases (bases first), with the default of
`eqx.field(default=...)` / `eqx.field(default_factory=...)` or of a plain assignment, and
without fields declared with `init=False`. Classes that define `__init__` themselves (or
inherit one from a base defined in the project) keep theirs.

Loaded by `mkdocs.yml` (`plugins.mkdocstrings.handlers.python.options.extensions`); it only
reads the source, it imports nothing.
"""

from typing import Any

from griffe import (
    Attribute,
    Class,
    Expr,
    ExprCall,
    Extension,
    Function,
    Module,
    Parameter,
    ParameterKind,
    Parameters,
)

_MODULE_PATHS = ("equinox.Module", "equinox._module.Module")
_FIELD_PATHS = ("equinox.field", "equinox._module.field", "dataclasses.field")


def _base_classes(cls: Class) -> list[Class]:
    """The bases of `cls` that Griffe has loaded (project classes), in declaration order."""
    found = []
    for base in cls.bases:
        path = base.canonical_path if isinstance(base, Expr) else str(base)
        try:
            target = cls.modules_collection[path]
        except (KeyError, ValueError, AttributeError):
            continue
        if getattr(target, "is_alias", False):
            try:
                target = target.final_target
            except Exception:  # an alias Griffe cannot resolve: not a project class
                continue
        if isinstance(target, Class):
            found.append(target)
    return found


def _is_module(cls: Class, seen: frozenset[str] = frozenset()) -> bool:
    """Whether `cls` derives from `equinox.Module`."""
    if cls.path in seen:
        return False
    for base in cls.bases:
        path = base.canonical_path if isinstance(base, Expr) else str(base)
        if path in _MODULE_PATHS:
            return True
    return any(_is_module(b, seen | {cls.path}) for b in _base_classes(cls))


def _lineage(cls: Class) -> list[Class]:
    """`cls` and its `equinox.Module` bases, most basic first, each once."""
    order: list[Class] = []

    def visit(c: Class) -> None:
        for b in _base_classes(c):
            if _is_module(b):
                visit(b)
        if c.path not in {o.path for o in order}:
            order.append(c)

    visit(cls)
    return order


def _field_arguments(value: Any) -> dict[str, Any] | None:
    """The keyword arguments of an `eqx.field(...)` call, or None for another value."""
    if isinstance(value, ExprCall) and value.canonical_path in _FIELD_PATHS:
        return {arg.name: arg.value for arg in value.arguments if getattr(arg, "name", None)}
    return None


def _fields(cls: Class) -> list[Parameter]:
    params = []
    for member in cls.members.values():
        if member.is_alias or not isinstance(member, Attribute) or member.annotation is None:
            continue
        labels = member.labels
        if "property" in labels or (
            "class-attribute" in labels and "instance-attribute" not in labels
        ):
            continue
        args = _field_arguments(member.value)
        if args is not None and str(args.get("init", "True")) == "False":
            continue
        if args is None:
            default = member.value
        elif "default_factory" in args:
            default = ExprCall(function=args["default_factory"], arguments=[])
        else:
            default = args.get("default")
        params.append(
            Parameter(
                member.name,
                annotation=member.annotation,
                kind=ParameterKind.positional_or_keyword,
                default=default,
                docstring=member.docstring,
            )
        )
    return params


def _has_own_init(cls: Class) -> bool:
    """Whether `cls` or an `equinox.Module` base defines `__init__` in the source."""
    return any(
        "__init__" in c.members and not c.extra["griffe_equinox"].get("generated")
        for c in _lineage(cls)
    )


def _apply(obj: Module | Class, done: set[str]) -> None:
    if obj.path in done:
        return
    done.add(obj.path)
    if isinstance(obj, Class) and _is_module(obj) and not _has_own_init(obj):
        by_name: dict[str, Parameter] = {}
        for c in _lineage(obj):
            for p in _fields(c):
                by_name[p.name] = p  # a redefinition in a subclass replaces the field
        init = Function(
            "__init__",
            lineno=0,
            endlineno=0,
            parent=obj,
            parameters=Parameters(
                Parameter("self", kind=ParameterKind.positional_or_keyword),
                *by_name.values(),
            ),
            returns="None",
        )
        obj.set_member("__init__", init)
        obj.extra["griffe_equinox"]["generated"] = True
    for member in list(obj.members.values()):
        if not member.is_alias and (member.is_module or member.is_class):
            _apply(member, done)


class EquinoxModules(Extension):
    """Add the dataclass constructor of every `equinox.Module` subclass of a package."""

    def on_package(self, *, pkg: Module, **kwargs: Any) -> None:
        _apply(pkg, set())
