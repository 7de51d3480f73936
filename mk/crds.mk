# CRDs and the CRD field reference, generated from the pydantic models (operator/agentrun/api).
.PHONY: crds
crds:
	agentrun crd > crds/agentrun.dev_agentruns.yaml
	agentrun crd --reference > docs/crd-reference.md
