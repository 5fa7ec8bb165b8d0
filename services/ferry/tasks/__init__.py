"""A task's record through its life: PENDING at admission, then one final status, then expiry."""
