"""residency: "charge dt/B as it is spent". vtc's selection and lift, with each tenant's counter
charged exactly the machine time the engine model charges it (fairlib/sim/policies/vtc.py):
prefill_ms_per_token * prefill_tokens / w_i at admission, per_seq / w_i per running sequence."""
import numpy as np

from fairlib.sim.policies.base import check_number
from fairlib.sim.policies.vtc import PID_RESIDENCY, VTC


class Residency(VTC):
    name, pid = "residency", PID_RESIDENCY
    params = {"weights": None}
    residency = 1
    counter_unit = "ms"

    def validate(self, v):
        w = v["weights"]
        if w is not None:
            w = [check_number(self.name, "weights", x, 0.0, strict=True) for x in np.atleast_1d(w)]
        return {"wp": 0.0, "wq": 0.0, "weights": w}

    def __repr__(self):
        return f"residency(weights={self.values['weights']!r})"
