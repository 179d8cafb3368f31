"""One module per routing policy, each implementing ``routing.policy.Policy``."""
