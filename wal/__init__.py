"""Write-ahead log objects on object storage: the object format, the flush pipeline, and the
object-store interface with its backends. Depends on no other neve package."""
