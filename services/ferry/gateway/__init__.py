"""The stateless HTTP gateway: validates, enqueues, answers with a task id, serves results."""
