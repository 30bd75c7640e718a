"""Output: what a recognised document leaves behind. Pages' records and journal (`page`),
Markdown, figures and layout written durably (`write`), searchable PDFs (`searchable`,
`textlayer`, `pdfa`), the original moved to done/ or failed/ (`settle`), and the hooks
told (`hooks`)."""
