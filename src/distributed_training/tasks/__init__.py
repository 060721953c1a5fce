"""The built-in tasks. A generated project carries the one its `task` answer names, as `<package>/task.py`."""
