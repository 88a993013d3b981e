"""Deploy a whole PyTorch model on tuned tctune kernels: `optimize(model, example_inputs)`.

    from deploy import optimize
    fast = optimize(model, x, precision="int8", target="h100", schedules="http://tctune:8000")
    y = fast(x)
    print(fast.report())

and on the GPU, each layer's schedule chosen among its runners-up by timing the whole model
(deploy.model_select: `candidates_from_service`, `choose_in_model`).

deploy uses `kernels` (the runtime), `api.client` (schedule lookup) and `api.plan` (models by
name, for `tctune-deploy`: deploy/cli.py); none of them imports it.
"""

from deploy.module import (
    Dequantize,
    FusedConv,
    KernelGlobalAvgPool,
    KernelLinear,
    KernelMaxPool2d,
    OptimizedModel,
    Quantize,
)
from deploy.optimize import optimize
from deploy.plan import LayerPlan, Record

__all__ = ["Dequantize", "FusedConv", "KernelGlobalAvgPool", "KernelLinear", "KernelMaxPool2d",
           "LayerPlan", "OptimizedModel", "Quantize", "Record", "optimize"]
