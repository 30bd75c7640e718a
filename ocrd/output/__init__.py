"""Output: what a recognised document leaves behind. Pages' records and journal (`page`),
Markdown, figures and layout written durably (`write`), searchable PDFs (`searchable`, with
its font in `pdffont`, the layer on a page in `pdflayer`, what text goes where in
`textlayer`, PDF/A in `pdfa`), the original moved to done/ or failed/ (`settle`), and the
hooks told (`hooks`)."""
