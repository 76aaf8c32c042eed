"""Prefect flows of MemAgent (deployments in ``prefect.yaml``, local stack in ``infra/prefect_stack.sh``).

- ``batch-qa`` (:mod:`flows.batch_qa`): the Ray Data batch QA job, with summary and trace artifacts;
- ``train-memagent`` (:mod:`flows.train`): synthesise -> filter -> train -> evaluate, resumable by stage;
- ``evaluate-memagent`` (:mod:`flows.evaluate`): the evaluation matrix (issue 7; not implemented yet).
"""
