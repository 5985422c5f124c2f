"""Serving: a continuous-batching simulation of a deployment (its requests, targets and
engine) on the performance model's step and prefill costs, and the capacity it answers:
the SLO-feasible rate per device, tensor-parallel degree and Medusa setting, the devices a
target rate needs, and the latency percentiles (perfmodel.serving.capacity.serve)."""
