"""Documents people make (Word, PowerPoint, Excel, web pages, Markdown, CSV), read by
docling's rule-based backends: no model, no network, nothing outside the file.

Parsing them is as dangerous as parsing a PDF (zip bombs, XML entities, macros, links to
local files, a million cells), so the file is only identified in the daemon (`detect.py`,
bounded reads); everything else happens in a render worker process, under its memory and
time limits: the safety checks (`inspect.py`), then the conversion (`read.py`). The
daemon puts the engine's text of each picture into the picture's place (`pictures.py`).

    limits.py    the bounds, and the refusal that names which one a file broke
    detect.py    what a file is, by its content (OOXML, HTML) or its name (Markdown, CSV)
    inspect.py   what a file must not hold, checked before docling parses it
    read.py      the conversion, in the worker: a DoclingDocument and its pictures' pixels
    embedded.py  a web page's and Markdown file's data: pictures, decoded for docling
    pictures.py  the pictures' text put into the DoclingDocument
"""
