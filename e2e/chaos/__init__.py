"""The chaos suite (issue 7): seeded random faults against the real local control plane, a real S3
server and the operator, with invariants checked after every scenario. See docs/chaos.md.

    python -m e2e.chaos --schedule ci|full [--seed N]     (or make chaos / make chaos-full)
"""
