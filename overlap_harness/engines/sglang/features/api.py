"""The hooks of a feature: what one SGLang switch or component needs of a variant's run.

A variant is its arrivals and a tuple of features (:mod:`..variants`). A feature is one
object (usually a frozen dataclass holding its own small configuration) of a class that
overrides the hooks it needs, as a pytest plugin implements the hooks it needs: every hook
of :class:`Feature` has a default that asks nothing. :func:`..driver.run_variant` calls each
hook of every feature of the variant, in the variant's (canonical) feature order:

``kernels``        the declare functions of the stand-in kernels the feature's path launches
``server_options`` its keyword arguments of SGLang's ``ServerArgs``
``switches``       a context for the run: environment switches, import-time platform flags
``worker_class``   the fake model worker it needs instead of the default one
``spec_workers``   a speculative worker installed in the scheduler before its overlap state
``pools``          other pools than the default ones (``build_scheduler``'s ``pools``)
``attach``         what it gives the built scheduler (graph runners, model kinds, ...)
``request``        what it does to each request before it is queued (a grammar)
``loop``           a context around the loop itself (a scripted peer rank)

and, outside the run, ``configuration`` (its keys of :data:`..configurations.SWITCHES`, by
which ``--config`` selects) and ``release_needs`` (the release features it drives, by which a
release that lacks them lists the variant as not applicable, :mod:`..release_features`).
Hooks get the :class:`~..variants.Variant` so a feature can ask about the others
(``variant.feature(Eagle)``, ``variant.speculative``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from overlap_harness.engines.sglang.release_features import Feature as ReleaseFeature
    from overlap_harness.engines.sglang.variants import Variant


class Feature:
    """One SGLang switch or component a variant runs with; subclasses override the hooks
    they need (every default asks nothing)."""

    #: the configuration keys this feature sets (:data:`..configurations.SWITCHES`); the
    #: first is the one its presence sets (one value whatever its configuration:
    #: ``speculative=eagle``), the others follow its configuration
    keys: ClassVar[tuple[str, ...]] = ()
    #: the SGLang server options and environment switches it drives, as a user writes them
    options: ClassVar[tuple[str, ...]] = ()
    #: a speculative worker (EAGLE, DSpark): one per variant, greedy sampling
    speculative: ClassVar[bool] = False
    #: the default fake worker publishes the runner's read-done event of each decode
    #: forward (as SGLang's graph runner does); a feature that brings its own runner, or a
    #: path that publishes none, says False
    fake_runner: ClassVar[bool] = True

    def configuration(self, variant: Variant) -> dict[str, str]:
        """Its configuration keys' values (only keys of :attr:`keys`)."""
        return {}

    def release_needs(self, variant: Variant) -> list[ReleaseFeature]:
        """The release features this feature drives."""
        return []

    def kernels(self, variant: Variant) -> tuple[Callable[[], None], ...]:
        """The ``declare`` functions of the stand-in kernels its path launches (each called
        once before the watch starts, whichever features ask for it)."""
        return ()

    def server_options(self, options: dict[str, Any], variant: Variant) -> None:
        """Set its ``ServerArgs`` keyword arguments in ``options``."""

    def switches(self, variant: Variant) -> AbstractContextManager[Any] | None:
        """A context entered around the scheduler's build and the loop (None: none)."""
        return None

    def worker_class(self, variant: Variant) -> type | None:
        """The fake model worker it needs (None: the default one). Two features of a
        variant may not ask for different ones."""
        return None

    def spec_workers(self, variant: Variant) -> Callable[[Any, Any], None] | None:
        """``build_scheduler``'s ``spec_workers``: ``fn(scheduler, sizes)`` installs a
        speculative worker (None: none)."""
        return None

    def pools(self, variant: Variant) -> Any:
        """``build_scheduler``'s ``pools`` (None: SGLang's default pools)."""
        return None

    def attach(self, scheduler: Any, server_args: Any, variant: Variant) -> None:
        """Give the built scheduler what this feature adds (before the loop starts)."""

    def request(self, request: Any, variant: Variant) -> None:
        """Change one request (SGLang's ``Req``) before it is queued."""

    def loop(self, scheduler: Any, variant: Variant, iteration: Callable[[], int]
             ) -> AbstractContextManager[Any] | None:
        """A context around ``event_loop_overlap`` itself (``iteration()``: the loop's
        current iteration); None: none."""
        return None


def on_off(flag: bool) -> str:
    """A switch's value: ``on`` or ``off``."""
    return "on" if flag else "off"
