# CRDs, the approval admission policies and the CRD field reference, generated from the pydantic models (operator/agentrun/api).
.PHONY: crds
crds:
	agentrun crd > crds/agentrun.dev_agentruns.yaml
	agentrun crd --agent > crds/agentrun.dev_agents.yaml
	agentrun crd --reference > docs/crd-reference.md
	agentrun crd --admission validating > crds/agentrun.dev_admission-policies.yaml
	agentrun crd --admission mutating > crds/agentrun.dev_admission-mutating.yaml
	agentrun crd --tenancy crd > crds/agentrun.dev_agentrunpolicies.yaml
	agentrun crd --schedule > crds/agentrun.dev_agentschedules.yaml
	agentrun crd --tenancy policy > crds/agentrun.dev_tenancy-policy.yaml
	agentrun crd --tenancy local > e2e/tenancy-local-policy.yaml
