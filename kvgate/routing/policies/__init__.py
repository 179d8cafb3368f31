"""One module per routing policy, each implementing ``kvgate.routing.policy.Policy``."""
