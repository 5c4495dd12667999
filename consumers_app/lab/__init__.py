"""The lab: controller (supervises workers, keeps the live state) and worker processes."""
