"""jaxrewrite: make JAX programs compile and run faster by rewriting their jaxprs.

    import jaxrewrite
    jaxrewrite.enable()                 # every outermost jax.jit of the program, rewritten
    f = jaxrewrite.optimize(f)          # or one function: a drop-in jax.jit
"""
from ._api import last_report as last_report
from ._explain import Explanation as Explanation
from ._explain import explain as explain
from ._api import make_jaxpr as make_jaxpr
from ._api import optimize as optimize
from ._api import rewrite_jaxpr as rewrite_jaxpr
from ._api import rewrite_jaxpr_with_report as rewrite_jaxpr_with_report
from ._options import OPTIONS as OPTIONS
from ._switch import disable as disable
from ._switch import enable as enable
from ._switch import enabled as enabled
from ._switch import is_enabled as is_enabled
from ._switch import skip as skip
from ._options import Options as Options
from .report.records import Report as Report

__version__ = "0.5.0"
