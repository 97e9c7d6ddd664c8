"""TaskFlow: ``@task.spot_training(...)`` (:mod:`.spot_training`), and what runs the decorated
function in the training process (:mod:`.entry`, :mod:`.result`).

Nothing is imported here: the training process runs ``python -m airflow_spot.decorators.entry``
in the user's image, where Airflow may be absent, and must not import the decorator's module.
"""
