"""`python -m neurojax.kernels`: build the compiled CPU kernel library now, with its messages
(what `make demo` runs before the demo), or say where it is when it is already built."""

import sys

from ._build import main

sys.exit(main())
