"""shmpad/net"""
