"""Not part of the package: what `python -m fastnn` runs when started in the folder that holds a clone named fastnn.

There Python finds the clone's top folder first, which has no __init__.py, and imports it as a namespace package:
`import fastnn` then has no `Trainer`, and `python -m fastnn` runs this file instead of fastnn/__main__.py. It
says what happened and how to fix it. (`python <checkout>` runs it too: then it runs the real command line.)
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))

if __spec__ is not None and __spec__.name == "fastnn.__main__":  # `python -m fastnn` found the clone's top folder
    sys.stderr.write(
        f"error: Python imported `fastnn` from {_HERE}, the top folder of a fastnn source checkout, as an empty "
        f"namespace package: it was started in that folder's parent ({os.getcwd()}), which comes first on the "
        f"module path. The package is {os.path.join(_HERE, 'fastnn')}. Fix: run from another folder (cd "
        f"{_HERE}, for instance), or install the checkout: pip install -e {_HERE}. In your own scripts the same "
        f"shadowing shows as \"module 'fastnn' has no attribute 'Trainer'\".\n"
    )
    sys.exit(1)

sys.path.insert(0, _HERE)
from fastnn.__main__ import main  # noqa: E402

sys.exit(main())
