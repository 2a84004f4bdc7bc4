"""Options: each product option declared once (``product``, by the means in ``declaration``),
and the job's record of what was asked and what it did (``job_options``)."""
