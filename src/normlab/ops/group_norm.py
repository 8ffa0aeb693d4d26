"""GroupNorm and InstanceNorm (placeholder until the room lands)."""


def group_norm(x, num_groups, w, b, eps, backend="ref"):
    raise NotImplementedError("normlab group_norm is not implemented yet")


def instance_norm(x, running_mean, running_var, w, b, use_input_stats, momentum, eps, backend="ref"):
    raise NotImplementedError("normlab instance_norm is not implemented yet")
