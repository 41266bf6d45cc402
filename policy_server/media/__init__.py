"""Camera frames before they become a request: the one size check every protocol runs before decoding
(:mod:`.media_check`), encoded frames decoded safely (:mod:`.image_decoding`) and named cameras composed
into the one image a view point asks for (:mod:`.camera_composition`).
"""
