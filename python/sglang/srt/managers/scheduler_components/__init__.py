"""The parts a Scheduler is composed of, each with its dependencies named in its constructor:
output processing (output_processor.py), failure handling (failure_policy.py) and the KT prefill slot's
lender (kt_prefill_slot_lender.py); batch_result.py holds what travels from launch to processing."""
