"""Prefect flows of MemAgent (deployments in ``prefect.yaml``, local stack in ``infra/prefect_stack.sh``).

- ``batch-qa`` (:mod:`flows.batch_qa`): the Ray Data batch QA job, with summary and trace artifacts;
- ``train-memagent`` (:mod:`flows.train`): synthesise -> filter -> train -> evaluate, resumable by stage;
- ``evaluate-memagent`` (:mod:`flows.evaluate`): accuracy over tasks x lengths, memory agent vs full context.
"""
