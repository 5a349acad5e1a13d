"""Suite-wide settings: the files that run the real pipeline go first.

scripts/test.sh runs the suite in two pytest-xdist workers, a file at a time each
(`--dist loadfile`, in the order collected): starting with the longest files keeps one worker
from being left alone with one of them at the end.
"""


def pytest_collection_modifyitems(items):
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: each file keeps its order
