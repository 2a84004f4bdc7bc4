"""What a plan is made from besides the inputs: this host's measured costs (``host``), the
workers' devices (``devices``), and a job's plan from its options and these facts (``job_plan``)."""
