"""shmpad/colocation"""
